// ScaleWindowPolicy: can an MXFP4 checkpoint be transcoded to NVFP4 without changing a single
// value (docs/formats.md §5, docs/quant.md), and which serving backends would lose precision?
//
// Per quantized tensor: the exponent range k = scale - 127 over active groups (any nonzero
// nibble), all-zero groups and their out-of-window scales, NaN scales (0xFF). Fused tensors
// (w1/w3, gate/up, q/k/v) share k_max. A group with pair_k_max - k > max_span is over-span and
// listed as (tensor, row, group, k, k_max). Backend hazards are separate findings. The
// thresholds are a named, versioned configuration recorded in every result.
#ifndef CKPT_CORE_QUANT_SCALE_WINDOW_H_
#define CKPT_CORE_QUANT_SCALE_WINDOW_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/finding.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

struct ScaleWindowConfig {
  std::string name = "scale-window";
  int version = 1;
  // E4M3 represents 2^-9 .. 2^8 exactly: k_max - k_j <= 17 keeps every block scale exact.
  int max_span = 17;
  // Marlin folds E4M3 scales; spans >= 15 (block scales below 2^-6) are a reported hazard.
  int marlin_span = 15;
  int marlin_min_scale_log2 = -6;
  size_t max_listed = 64;  // findings listed per kind; all are counted

  std::string id() const { return name + "/" + std::to_string(version); }
  nlohmann::json ToJson() const;
};

struct TensorScaleStats {
  std::string tensor;       // module name (without .weight_packed)
  std::string kind;         // mxfp4 | nvfp4 | x4t
  std::string fused_group;  // modules sharing k_max / the global scale
  uint64_t rows = 0, groups = 0, active_groups = 0, zero_groups = 0;
  uint64_t zero_groups_out_of_window = 0, nan_scales_active = 0, nan_scales_zero = 0;
  uint64_t over_span_groups = 0;
  std::optional<int> k_min, k_max, pair_k_max;  // MXFP4/X4T exponents; NVFP4: log2 of scales
  std::optional<uint32_t> global_scale_bits;    // NVFP4 weight_global_scale, F32 bits
  int span() const { return k_min && pair_k_max ? *pair_k_max - *k_min : 0; }
  nlohmann::json ToJson() const;
};

enum class ScaleWindowVerdict { kLosslessTranscodable, kOverSpan, kNaNScale, kNotMxfp4, kNoQuantizedTensors };
std::string VerdictName(ScaleWindowVerdict v);

struct ScaleWindowResult {
  ScaleWindowConfig config;
  ScaleWindowVerdict verdict = ScaleWindowVerdict::kNoQuantizedTensors;
  std::vector<TensorScaleStats> tensors;  // sorted by tensor name
  FindingList over_span;                  // code "over-span"
  FindingList nan_scales;                 // "nan-scale" (active group) / "nan-scale-zero-group"
  FindingList hazards;                    // "vllm-w13-global-scale-collapse", ...
  uint64_t zero_groups_out_of_window = 0;

  const TensorScaleStats* Find(const std::string& tensor) const;
  nlohmann::json ToJson() const;
};

// "…experts.3.w13" for w1/w3 and for a routed expert's gate/up_proj (vLLM's fused-MoE w13),
// "….gate_up" for a dense gate/up_proj, "….qkv" for q/k/v_proj, else the module itself.
std::string FusedGroupOf(const std::string& module);

// One unit of the scan: the modules of one fused group (they share k_max), or the experts of a
// gpt-oss `*_blocks` tensor (members named "base[e]", sharing k_max). Its tensors are all the
// scan reads.
struct ScaleWindowUnit {
  struct Member {
    size_t order = 0;  // position among all members: results are merged in this order
    std::string name;
    std::string gpt_oss_base;  // non-empty for an expert slice of `base_blocks`
    uint64_t expert = 0;
    uint64_t bytes = 0;  // packed bytes (progress)
  };
  std::string fused_group;
  std::vector<Member> members;
  std::vector<std::string> tensors;
};

// What scanning one unit found, until Finish merges it.
struct ScaleWindowPartial {
  struct Member;  // scale_window.cc
  std::vector<std::shared_ptr<Member>> members;
};

// A partial's members as plain values, for a split audit's part file (core/audit/parts.h):
// what Finish reads of each.
struct ScaleWindowMemberResult {
  size_t order = 0;
  TensorScaleStats stats;
  FindingList nan, over_span;
};
std::vector<ScaleWindowMemberResult> MembersOf(const ScaleWindowPartial& partial);
ScaleWindowPartial PartialOf(std::vector<ScaleWindowMemberResult> members);

class ScaleWindowPolicy {
 public:
  explicit ScaleWindowPolicy(ScaleWindowConfig config = {}) : config_(std::move(config)) {}
  const ScaleWindowConfig& config() const { return config_; }
  // Errors only for unreadable tensors (mis-shaped, undecodable X4T streams); policy outcomes
  // are in the result. Parallel by unit on `threads` (0 = all cores). Plan + Scan + Finish.
  absl::StatusOr<ScaleWindowResult> Check(const Checkpoint& ckpt, Progress& progress,
                                          unsigned threads = 0) const;

  // The same check in pieces, for a streamed audit (core/io/tree_stream.h) that runs each
  // unit as soon as its tensors are in memory. Plan reads headers only; Scan reads the unit's
  // tensors (INTERNAL when they are not in memory); Finish is independent of the order in which
  // units were scanned.
  absl::StatusOr<std::vector<ScaleWindowUnit>> Plan(const Checkpoint& ckpt) const;
  absl::StatusOr<ScaleWindowPartial> Scan(const Checkpoint& ckpt,
                                          const ScaleWindowUnit& unit) const;
  ScaleWindowResult Finish(std::vector<ScaleWindowPartial> parts) const;

 private:
  ScaleWindowConfig config_;
};

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_SCALE_WINDOW_H_
