// Verification of a (source, derived) checkpoint pair: is the derived checkpoint a lossless
// re-encoding of the source (docs/formats.md §5, docs/quant.md "Pair verification")?
//
// Source: compressed-tensors MXFP4. Derived: NVFP4 (compressed-tensors or ModelOpt, whose
// global is a multiplier: docs/formats.md §9) or an X4T container.
// Or source gpt-oss MXFP4 and derived its ModelOpt NVFP4 export (gpt_oss_pair.h).
// Checked: the inventories correspond one to one; packed bytes of every quantized tensor are
// identical (X4T w2 un-permuted when declared); every reconstructed value is identical (per
// 16-block, 2^k_j == weight_scale / weight_global_scale exactly, else element by element; X4T
// scale planes decode to the source bytes); w1/w3 global scales are equal; every other tensor
// is bit-identical by SHA-256. All-zero groups whose scale was canonicalized are counted.
#ifndef CKPT_CORE_QUANT_PAIR_VERIFY_H_
#define CKPT_CORE_QUANT_PAIR_VERIFY_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/finding.h"
#include "core/quant/format.h"
#include "core/quant/fp4_tensor.h"
#include "core/quant/gpt_oss_pair.h"
#include "core/sha256.h"

namespace ckpt::quant {

struct PairVerifyOptions {
  size_t max_findings = 20;  // mismatches listed; all are counted
  unsigned threads = 0;      // 0 = all cores
  FormatOptions format;      // root mappings for an X4T derived checkpoint
};

// Per quantized source tensor (a module, or a gpt-oss stacked expert tensor across all its
// experts), its 16-element blocks (two per E8M0 group): how many lie in the window our lossless
// cast keeps exact (k_max over the fused group's active groups with a finite scale, k_max - k
// <= 17; all-zero blocks always, an active NaN-scale block never), and, separately, how many
// ModelOpt's closed-form cast would count lossless (k_max over every group whose scale byte is
// > 0, all-zero groups included; byte 0 or k_max - k <= 17: docs/formats.md §9, docs/quant.md
// "ModelOpt NVFP4" and "gpt-oss layouts").
struct PairWindowCount {
  std::string tensor;
  uint64_t blocks = 0, lossless_window = 0, modelopt_rule = 0;
  std::optional<int> k_max_active, k_max_modelopt;  // exponents (byte - 127), fused
};

struct PairVerifyResult {
  bool lossless = false;
  std::string source_format, derived_format;  // FormatReport::Describe()
  std::string derived_kind;  // "nvfp4" | "x4t" | "mixed"
  uint64_t quantized_tensors = 0, packed_bytes_compared = 0, value_blocks_compared = 0;
  uint64_t ignored_tensors_compared = 0, ignored_bytes_compared = 0;
  uint64_t fused_groups_checked = 0, zero_groups_canonicalized = 0;
  FindingList mismatches;  // codes listed in docs/quant.md
  // What the source would do under ModelOpt's cast (not mismatches: they do not decide the
  // verdict): "zero-group-scale-sets-kmax", "modelopt-kmax-lossy-blocks",
  // "fused-kmax-not-shared".
  FindingList hazards;
  // Either side's format warnings (FormatReport::warnings, "source:" / "derived:" prefixed):
  // recorded, never deciding the verdict.
  FindingList warnings;
  std::vector<PairWindowCount> windows;  // one per quantized module, in unit order

  std::string verdict() const { return lossless ? "lossless" : "mismatch"; }
};

// The check in pieces, for a streamed audit (core/io/tree_stream.h) that compares each unit as
// soon as its tensors on both sides are in memory. PlanPair reads headers only: formats,
// inventory mismatches and the units; CompareUnit reads one unit's tensors; FinishPair merges
// the outcomes (parallel to plan.units) into the result VerifyPair gives.
struct PairUnit {
  std::string name;  // a quantized module, or a non-quantized tensor compared by SHA-256
  bool module = false;
  std::vector<std::string> source_tensors, derived_tensors;  // what the comparison reads
  uint64_t bytes = 0;  // source bytes (progress)
  bool gpt_oss = false;  // a module that is a gpt-oss stacked expert tensor (gpt_oss_pair.h)
};
struct PairPlan {
  PairVerifyResult result;  // formats and inventory mismatches so far
  std::vector<PairUnit> units;
};
struct PairUnitOutcome {
  FindingList found{0};
  uint64_t packed_bytes = 0, value_blocks = 0, zero_canonicalized = 0, ignored_bytes = 0;
  std::optional<uint32_t> global_bits;  // NVFP4 modules
  // Source E8M0 groups by scale byte: on groups with a nonzero code, and on all-zero groups.
  std::array<uint64_t, 256> active_bytes{}, zero_bytes{};
};
// Counts the source's E8M0 scale bytes into o->active_bytes / o->zero_bytes by group activity:
// what FinishPair's window counts and ModelOpt-cast hazards are taken from.
void CountScaleBytes(const Mxfp4View& source, PairUnitOutcome* o);
absl::StatusOr<PairPlan> PlanPair(const Checkpoint& source, const Checkpoint& derived,
                                  const PairVerifyOptions& options);
absl::StatusOr<PairUnitOutcome> CompareUnit(const Checkpoint& source, const Checkpoint& derived,
                                            const PairUnit& unit, const PairVerifyOptions& options);
// A non-quantized unit (`!unit.module`) from its two tensors' SHA-256 alone, as CompareUnit
// gives it: a stream may hash such tensors as they pass instead of holding them.
PairUnitOutcome CompareDigests(const Checkpoint& source, const Checkpoint& derived,
                               const PairUnit& unit, const Digest& source_sha256,
                               const Digest& derived_sha256, const PairVerifyOptions& options);
PairVerifyResult FinishPair(PairPlan plan, const std::vector<PairUnitOutcome>& outcomes);

// Contract findings of either side (DetectFormat) are mismatches too, coded "source:<code>" and
// "derived:<code>". Errors (not findings): INVALID_ARGUMENT when the source is not
// compressed-tensors MXFP4 or the derived is neither NVFP4 nor X4T (a gpt-oss MXFP4 source:
// when the derived is not a ModelOpt export), or a tensor cannot be read as its declared kind;
// DATA_LOSS for undecodable X4T streams or files changed during the run.
absl::StatusOr<PairVerifyResult> VerifyPair(const Checkpoint& source, const Checkpoint& derived,
                                            const PairVerifyOptions& options, Progress& progress);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_PAIR_VERIFY_H_
