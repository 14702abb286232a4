#include "core/audit/weight_files.h"

#include <algorithm>
#include <array>
#include <set>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ckpt::audit {
namespace {

// Extensions of files that hold weights or other tensors, compared without case
// (docs/audit-engine.md, "Weights no check reads").
constexpr std::array<std::string_view, 12> kWeightExtensions = {
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf",
    ".ggml",        ".h5",  ".msgpack", ".npz", ".pkl", ".onnx"};

// Formats that a loader reads from the root by default and the checks do not: vLLM and SGLang
// load every `*.bin` when there is no `*.safetensors` (and `*.pt` with --load-format pt),
// transformers loads `pytorch_model*.bin`, TensorFlow's `tf_model.h5` and Flax's
// `flax_model.msgpack`; a `*.gguf` is loaded by vLLM, SGLang and llama.cpp.
constexpr std::array<std::string_view, 6> kDefaultLoadExtensions = {".bin", ".pt", ".pth",
                                                                     ".gguf", ".h5", ".msgpack"};

// Training state written next to weights by the transformers Trainer; vLLM skips these names
// when it globs `*.bin` / `*.pt`.
bool IsTrainingState(std::string_view name) {
  static const std::set<std::string_view> kNames = {
      "training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt",
      "rng_state.pth"};
  return kNames.contains(name) || (name.starts_with("rng_state_") && name.ends_with(".pth"));
}

bool IsWeightLike(std::string_view path) {
  const std::string lower = absl::AsciiStrToLower(std::string(path));
  return std::any_of(kWeightExtensions.begin(), kWeightExtensions.end(),
                     [&](std::string_view ext) { return lower.ends_with(ext); });
}

// Why a default loader reads this root *.safetensors although the layout does not name it.
std::string UnindexedReason(const Checkpoint& ckpt, std::string_view name) {
  if (ckpt.layout() != CheckpointLayout::kSharded) {
    return "vLLM and SGLang load every *.safetensors at the root";
  }
  if (name == "model.safetensors") {
    return "transformers loads model.safetensors in preference to "
           "model.safetensors.index.json";
  }
  return "not listed in model.safetensors.index.json; a loader that globs *.safetensors "
         "(vLLM or SGLang without the index, Mistral's consolidated format) reads it";
}

}  // namespace

std::vector<UncheckedWeightFile> UncheckedWeightFiles(const Checkpoint& ckpt) {
  std::set<std::string> checked;
  for (const auto& shard : ckpt.shards()) checked.insert(ckpt.RelativePath(*shard));
  std::vector<UncheckedWeightFile> out;
  for (const ImageFile& f : ckpt.image().files) {
    if (checked.contains(f.path) || !IsWeightLike(f.path)) continue;
    UncheckedWeightFile u{f.name, f.size(), "unchecked-weights-file", false, ""};
    const bool at_root = f.path.find('/') == std::string::npos;
    if (!at_root) {
      u.reason = "in a subfolder, which no common loader reads by default";
    } else if (IsTrainingState(f.path)) {
      u.reason = "training state, which loaders skip";
    } else if (f.path.ends_with(".safetensors")) {
      if (ckpt.layout() == CheckpointLayout::kSharded && f.path.starts_with("x4t-layer-")) {
        // Container A (docs/quant.md): loaders read the index's shards, not the sidecar.
        u.reason = "an X4T container A sidecar beside the index";
      } else {
        u.code = "unindexed-weights-file";
        u.fails = true;
        u.reason = UnindexedReason(ckpt, f.path);
      }
    } else if (std::any_of(kDefaultLoadExtensions.begin(), kDefaultLoadExtensions.end(),
                           [&](std::string_view ext) { return f.path.ends_with(ext); })) {
      u.code = "unsupported-weights-file";
      u.fails = true;
      u.reason = "a loader reads this format from the root by default (transformers, vLLM, "
                 "SGLang or llama.cpp), and the checks do not read it";
    } else {
      u.reason = "a format no common loader reads from the root by default";
    }
    out.push_back(std::move(u));
  }
  return out;
}

void AddUncheckedWeightFiles(const Checkpoint& ckpt, evidence::CheckResult* check) {
  std::vector<UncheckedWeightFile> files = UncheckedWeightFiles(ckpt);
  if (files.empty()) return;
  std::vector<std::string> names;
  for (const UncheckedWeightFile& u : files) names.push_back(u.name);
  // Failing files first, so that the record's first findings always show them.
  std::stable_partition(files.begin(), files.end(),
                        [](const UncheckedWeightFile& u) { return u.fails; });
  for (const UncheckedWeightFile& u : files) {
    evidence::Finding f;
    f.code = u.code;
    f.path = u.name;
    f.message = absl::StrCat(u.name, ": weights that no check read (", u.reason, ")");
    f.numbers["bytes"] = static_cast<int64_t>(u.bytes);
    f.fails = u.fails;
    if (u.fails) check->verdict = evidence::Verdict::kFail;
    check->findings.push_back(std::move(f));
  }
  check->counts["unchecked_weight_files"] = static_cast<int64_t>(files.size());
  check->details.Set("unchecked_weight_files", std::move(names));
}

}  // namespace ckpt::audit
