#include "core/forward/forward_audit.h"

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::forward {
namespace {

int IntOr(const nlohmann::json& c, const char* key, int fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  const long long v = it->get<long long>();
  return v < 0 || v > (1 << 20) ? fallback : static_cast<int>(v);
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

}  // namespace ckpt::forward
