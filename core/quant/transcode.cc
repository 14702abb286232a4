#include "core/quant/transcode.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/quant/codecs.h"
#include "core/quant/quant_weight.h"
#include "core/quant/safetensors_writer.h"
#include "core/text/json_dump.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string PolicyFailure(const ScaleWindowResult& r) {
  const FindingList& list = r.verdict == ScaleWindowVerdict::kNaNScale ? r.nan_scales : r.over_span;
  std::string msg = absl::StrCat("scale-window policy ", r.config.id(), ": ", VerdictName(r.verdict),
                                 ", ", list.total(), " group(s); nothing was written");
  size_t shown = 0;
  for (const Finding& f : list.kept()) {
    if (f.code == "nan-scale-zero-group") continue;
    if (++shown > 5) break;
    absl::StrAppend(&msg, "; ", f.ToText());
  }
  return msg;
}

// The derived tensors of one MXFP4 module: E4M3 block scales and the global scale.
struct DerivedScales {
  std::vector<uint8_t> block_scales;
  float global_scale = 1.0f;
  uint64_t zero_groups = 0;
};

absl::StatusOr<DerivedScales> DeriveScales(const QuantWeight& w, int k_max) {
  absl::StatusOr<Mxfp4View> v = Mxfp4ViewOf(w);
  if (!v.ok()) return v.status();
  DerivedScales d;
  d.global_scale = std::ldexp(1.0f, 8 - k_max);
  const uint64_t groups = v->groups_per_row();
  d.block_scales.assign(w.rows * groups * 2, 0);
  for (uint64_t r = 0; r < w.rows; ++r) {
    for (uint64_t g = 0; g < groups; ++g) {
      if (!v->GroupActive(r, g)) {
        ++d.zero_groups;  // canonical +0: values are zero whatever the scale
        continue;
      }
      const int e = EncodeE4M3PowerOfTwo(E8M0Exponent(v->ScaleByte(r, g)) - k_max + 8);
      if (e < 0 || v->ScaleByte(r, g) == kE8M0NaN) {
        return absl::FailedPreconditionError(
            absl::StrCat(w.module, " row ", r, " group ", g, ": scale outside the E4M3 window"));
      }
      d.block_scales[(r * groups + g) * 2] = d.block_scales[(r * groups + g) * 2 + 1] =
          static_cast<uint8_t>(e);
    }
  }
  return d;
}

std::vector<uint8_t> F32Bytes(float f) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &f, 4);
  return b;
}

}  // namespace

nlohmann::json TranscodeResult::ToJson() const {
  return {{"policy", policy.ToJson()},
          {"files", files},
          {"tensors_written", tensors_written},
          {"modules_transcoded", modules_transcoded},
          {"bytes_written", bytes_written},
          {"zero_groups_canonicalized", zero_groups_canonicalized}};
}

nlohmann::json Nvfp4QuantizationConfig(const nlohmann::json& q) {
  nlohmann::json out = q;
  out["format"] = "nvfp4-pack-quantized";
  if (out.contains("config_groups") && out["config_groups"].is_object()) {
    for (auto& [name, group] : out["config_groups"].items()) {
      if (group.contains("weights") && group["weights"].is_object()) {
        group["weights"]["group_size"] = 16;
        group["weights"]["strategy"] = "tensor_group";
      }
    }
  }
  return out;
}

absl::StatusOr<TranscodeResult> TranscodeToNvfp4(const Checkpoint& src, const std::string& dst,
                                                 const TranscodeOptions& options,
                                                 Progress& progress) {
  const nlohmann::json& q = src.text_config().contains("quantization_config")
                                ? src.text_config()["quantization_config"]
                                : src.config().value("quantization_config", nlohmann::json());
  if (src.layout() == CheckpointLayout::kX4TContainer || !q.is_object() ||
      q.value("format", "") != "mxfp4-pack-quantized") {
    return absl::InvalidArgumentError(absl::StrCat(
        src.root(), ": transcode needs a compressed-tensors mxfp4-pack-quantized checkpoint"));
  }
  std::error_code ec;
  if (fs::exists(dst, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(dst, ": already exists; not overwriting"));
  }
  ScaleWindowPolicy policy(options.policy);
  absl::StatusOr<ScaleWindowResult> checked = policy.Check(src, progress, options.threads);
  if (!checked.ok()) return checked.status();
  TranscodeResult result;
  result.policy = *std::move(checked);
  for (const TensorScaleStats& t : result.policy.tensors) {
    if (t.kind != "mxfp4") {
      return absl::InvalidArgumentError(absl::StrCat(t.tensor, ": is ", t.kind, ", not MXFP4"));
    }
  }
  if (result.policy.verdict != ScaleWindowVerdict::kLosslessTranscodable) {
    return absl::FailedPreconditionError(PolicyFailure(result.policy));
  }

  // Temporary directory beside DST, renamed into place at the end.
  const fs::path dst_path = fs::absolute(dst).lexically_normal();
  std::string tmpl = (dst_path.parent_path() / ("." + dst_path.filename().string() + ".tmp-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::DataLossError(absl::StrCat(tmpl, ": cannot create: ", std::strerror(errno)));
  }
  const std::string tmp = tmpl;
  auto fail = [&](absl::Status s) {
    fs::remove_all(tmp, ec);
    return s;
  };

  std::map<std::string, const TensorScaleStats*> stats;
  for (const TensorScaleStats& t : result.policy.tensors) stats[t.tensor] = &t;
  std::set<std::string> shard_names;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  progress.Begin("transcode", src.total_tensor_bytes());
  for (const auto& shard : src.shards()) {
    const std::string rel = src.RelativePath(*shard);
    std::vector<TensorToWrite> out;
    std::vector<const TensorInfo*> modules;
    for (const TensorInfo& t : shard->tensors()) {
      if (absl::EndsWith(t.name, kPackedSuffix)) {
        modules.push_back(&t);
        out.push_back(TensorToWrite::Borrowed(t, shard->Bytes(t)));
      } else {
        const std::string m = absl::EndsWith(t.name, kScaleSuffix)
                                  ? t.name.substr(0, t.name.size() - strlen(kScaleSuffix))
                                  : "";
        if (m.empty() || !stats.count(m)) out.push_back(TensorToWrite::Borrowed(t, shard->Bytes(t)));
      }
    }
    std::vector<DerivedScales> derived(modules.size());
    absl::Status st = ParallelFor(modules.size(), options.threads, [&](size_t i) {
      const std::string m = modules[i]->name.substr(0, modules[i]->name.size() - strlen(kPackedSuffix));
      absl::StatusOr<QuantWeight> w = ResolveWeight(src, m);
      if (!w.ok()) return w.status();
      const TensorScaleStats* s = stats.at(m);
      // A fused group without any nonzero value gets global scale 1 (k_max = 8).
      absl::StatusOr<DerivedScales> d = DeriveScales(*w, s->pair_k_max.value_or(8));
      if (!d.ok()) return d.status();
      derived[i] = *std::move(d);
      return absl::OkStatus();
    });
    if (!st.ok()) return fail(st);
    for (size_t i = 0; i < modules.size(); ++i) {
      const std::string m = modules[i]->name.substr(0, modules[i]->name.size() - strlen(kPackedSuffix));
      const uint64_t rows = modules[i]->shape[0], cols = modules[i]->shape[1] * 2;
      out.push_back(TensorToWrite::Owned(m + kScaleSuffix, DType::kF8_E4M3, {rows, cols / 16},
                                         std::move(derived[i].block_scales)));
      out.push_back(TensorToWrite::Owned(m + kGlobalScaleSuffix, DType::kF32, {1},
                                         F32Bytes(derived[i].global_scale)));
      result.zero_groups_canonicalized += derived[i].zero_groups;
      ++result.modules_transcoded;
    }
    uint64_t shard_bytes = 0;
    for (const TensorToWrite& t : out) {
      weight_map[t.name] = rel;
      shard_bytes += t.data().size();
      ++result.tensors_written;
    }
    total_size += shard_bytes;
    st = WriteSafetensors(tmp + "/" + rel, std::move(out), shard->metadata());
    if (!st.ok()) return fail(st);
    result.files.push_back(rel);
    result.bytes_written += shard_bytes;
    progress.Advance(shard->file_size() - shard->data_start());
  }
  progress.End();

  nlohmann::json config = src.config();
  if (config.contains("quantization_config")) {
    config["quantization_config"] = Nvfp4QuantizationConfig(config["quantization_config"]);
  }
  if (config.contains("text_config") && config["text_config"].contains("quantization_config")) {
    config["text_config"]["quantization_config"] =
        Nvfp4QuantizationConfig(config["text_config"]["quantization_config"]);
  }
  absl::Status st = WriteText(tmp + "/config.json", DumpJson(config, 2));
  result.files.push_back("config.json");
  if (st.ok() && src.layout() == CheckpointLayout::kSharded) {
    nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    st = WriteText(tmp + "/model.safetensors.index.json", DumpJson(index, 2));
    result.files.push_back("model.safetensors.index.json");
  }
  // Other top-level files of the root (tokenizer, generation config) are carried over
  // unchanged, from the bytes that were read.
  for (const ImageFile& f : src.image().files) {
    const std::string& name = f.name;
    if (!st.ok() || name.find('/') != std::string::npos || name == "config.json" ||
        name == "model.safetensors.index.json" || absl::EndsWith(name, ".safetensors")) {
      continue;
    }
    absl::StatusOr<std::span<const uint8_t>> bytes = src.image().Content(name);
    st = bytes.ok() ? WriteText(tmp + "/" + f.path,
                                std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()))
                    : bytes.status();
    result.files.push_back(name);
  }
  if (st.ok()) st = src.CheckUnchanged();
  if (st.ok() && ::rename(tmp.c_str(), dst_path.c_str()) != 0) {
    st = absl::DataLossError(absl::StrCat(dst, ": rename failed: ", std::strerror(errno)));
  }
  if (!st.ok()) return fail(st);
  return result;
}

}  // namespace ckpt::quant
