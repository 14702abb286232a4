#include "core/forward/forward_audit.h"

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/forward/forward_stream.h"
#include "core/io/tree_stream.h"

namespace ckpt::forward {
namespace {

int IntOr(const nlohmann::json& c, const char* key, int fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  const long long v = it->get<long long>();
  return v < 0 || v > (1 << 20) ? fallback : static_cast<int>(v);
}

// Reads the headers of `o.root` (and `o.source`), plans the forward of the layers `spec` names
// (empty: o.layer alone), streams both trees once in the window and finishes into the report.
absl::StatusOr<ForwardAuditResult> RunStreamed(const ForwardAuditOptions& o,
                                               const ForwardDevice& device,
                                               const std::string& spec, ForwardReadStats* stats) {
  ReadOptions read = Checkpoint::ReadOnly();
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.memory_window = o.memory_window;
  read.threads = o.threads;
  std::vector<std::shared_ptr<const TreeImage>> images;
  std::shared_ptr<const Checkpoint> derived, source;
  for (const std::string* root : {&o.root, &o.source}) {
    if (root->empty()) continue;
    auto ckpt = Checkpoint::Open(*root, read);
    if (!ckpt.ok()) return ckpt.status();
    std::shared_ptr<const Checkpoint> shared = *std::move(ckpt);
    // The image lives as long as its checkpoint: the stream lends tensors to its shards.
    images.push_back(std::shared_ptr<const TreeImage>(shared, &shared->image()));
    (derived == nullptr ? derived : source) = std::move(shared);
  }
  std::vector<int> layers = {o.layer};
  if (!spec.empty()) {
    auto resolved = ResolveLayers(spec, derived->text_config());
    if (!resolved.ok()) {
      return absl::Status(resolved.status().code(),
                          absl::StrCat(derived->root(), ": ", resolved.status().message()));
    }
    layers = *std::move(resolved);
  }
  auto plan = StreamedForward::Plan(*derived, source.get(), std::move(layers), o, device);
  if (!plan.ok()) return plan.status();
  auto streamed = StreamTrees(images, (*plan)->Work(0), read, NoProgress());
  if (!streamed.ok()) return streamed.status();
  for (const auto& image : streamed->images) {
    if (absl::Status s = image->CheckUnchanged(); !s.ok()) return s;
  }
  if (stats != nullptr) *stats = {streamed->bytes_read, streamed->peak_kept_bytes};
  return (*plan)->Finish(spec);
}

}  // namespace

std::string EmulationName(Emulation e) {
  return e == Emulation::kVllmW13Collapse ? "vllm-w13-collapse" : "none";
}

absl::StatusOr<Emulation> ParseEmulation(const std::string& s) {
  if (s.empty() || s == "none") return Emulation::kNone;
  if (s == "vllm-w13-collapse") return Emulation::kVllmW13Collapse;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --emulate '", s, "' (none|vllm-w13-collapse)"));
}

absl::StatusOr<std::vector<int>> ResolveLayers(const std::string& spec,
                                               const nlohmann::json& c) {
  const int layers = IntOr(c, "num_hidden_layers", 0);
  std::vector<int> out;
  if (spec == "all") {
    if (layers <= 0) {
      return absl::InvalidArgumentError(
          "--layers all: config.json has no valid integer 'num_hidden_layers'");
    }
    const int dense = c.value("model_type", "") == "gpt_oss"
                          ? 0 : IntOr(c, "first_k_dense_replace", 0);
    for (int l = dense; l < layers; ++l) out.push_back(l);
  } else {
    std::set<int> seen;
    for (absl::string_view item : absl::StrSplit(spec, ',')) {
      int l = -1;
      if (!absl::SimpleAtoi(item, &l) || l < 0 || (layers > 0 && l >= layers) || l > (1 << 20)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--layers: '", item, "' is not a layer index", layers > 0 ? " in [0, " : "",
            layers > 0 ? absl::StrCat(layers, ")") : "", " (expected all or L1,L2,...)"));
      }
      if (!seen.insert(l).second) {
        return absl::InvalidArgumentError(absl::StrCat("--layers: layer ", l, " named twice"));
      }
      out.push_back(l);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--layers names no MoE layer");
  for (int l : out) {
    if (auto cfg = ParseBlockConfig(c, l); !cfg.ok()) return cfg.status();
  }
  return out;
}

ForwardDevice CpuDevice() {
  return {"cpu", "CPU reference (core/forward)", CpuStages(), std::nullopt};
}

absl::StatusOr<ForwardAuditResult> RunForwardAudit(const ForwardAuditOptions& o,
                                                   const ForwardDevice& device,
                                                   ForwardReadStats* stats) {
  return RunStreamed(o, device, "", stats);
}

absl::StatusOr<ForwardAuditResult> RunModelForward(const std::string& spec,
                                                   const ForwardAuditOptions& o,
                                                   const ForwardDevice& device,
                                                   ForwardReadStats* stats) {
  if (!o.output_path.empty()) {
    return absl::InvalidArgumentError("--output writes one layer's tensors; use --layer");
  }
  return RunStreamed(o, device, spec, stats);
}

}  // namespace ckpt::forward
