// Verification of a (source, derived) checkpoint pair: is the derived checkpoint a lossless
// re-encoding of the source (docs/formats.md §5, docs/quant.md "Pair verification")?
//
// Source: compressed-tensors MXFP4. Derived: NVFP4 (compressed-tensors) or an X4T container.
// Checked: the inventories correspond one to one; packed bytes of every quantized tensor are
// identical (X4T w2 un-permuted when declared); every reconstructed value is identical (per
// 16-block, 2^k_j == weight_scale / weight_global_scale exactly, else element by element; X4T
// scale planes decode to the source bytes); w1/w3 global scales are equal; every other tensor
// is bit-identical by SHA-256. All-zero groups whose scale was canonicalized are counted.
#ifndef CKPT_CORE_QUANT_PAIR_VERIFY_H_
#define CKPT_CORE_QUANT_PAIR_VERIFY_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/finding.h"
#include "core/quant/format.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

struct PairVerifyOptions {
  size_t max_findings = 20;  // mismatches listed; all are counted
  unsigned threads = 0;      // 0 = all cores
  FormatOptions format;      // root mappings for an X4T derived checkpoint
};

struct PairVerifyResult {
  bool lossless = false;
  std::string source_format, derived_format;  // FormatReport::Describe()
  std::string derived_kind;  // "nvfp4" | "x4t" | "mixed"
  uint64_t quantized_tensors = 0, packed_bytes_compared = 0, value_blocks_compared = 0;
  uint64_t ignored_tensors_compared = 0, ignored_bytes_compared = 0;
  uint64_t fused_groups_checked = 0, zero_groups_canonicalized = 0;
  FindingList mismatches;  // codes listed in docs/quant.md

  std::string verdict() const { return lossless ? "lossless" : "mismatch"; }
  nlohmann::json ToJson() const;
};

// Contract findings of either side (DetectFormat) are mismatches too, coded "source:<code>" and
// "derived:<code>". Errors (not findings): INVALID_ARGUMENT when the source is not
// compressed-tensors MXFP4 or the derived is neither NVFP4 nor X4T, or a tensor cannot be read as its declared kind; DATA_LOSS for undecodable X4T
// streams or files changed during the run.
absl::StatusOr<PairVerifyResult> VerifyPair(const Checkpoint& source, const Checkpoint& derived,
                                            const PairVerifyOptions& options, Progress& progress);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_PAIR_VERIFY_H_
