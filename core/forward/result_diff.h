// Bitwise comparison of two block results (source weights vs derived weights, or a run vs its
// re-run): per tensor, equality, differing-element count, max |diff| and a ULP histogram.
//
// Values are compared in the precision they were computed in (float bits for f32/bf16, double
// bits for f64), so "bitwise equal" means the bytes a caller would store are equal. JSON output
// (a tensor's, for `ckpt-audit diff`; the block forward's is core/evidence/block_forward.h)
// carries no floating-point numbers: magnitudes are decimal strings (formats.md §8).
#ifndef CKPT_CORE_FORWARD_RESULT_DIFF_H_
#define CKPT_CORE_FORWARD_RESULT_DIFF_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/forward/block_forward.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

// ULP-distance buckets of the histogram: 0, 1, 2-3, 4-15, 16-255, 256 and more.
inline constexpr int kUlpBuckets = 6;

// The histogram bucket of a ULP distance.
int UlpBucket(uint64_t ulps);

struct TensorDiff {
  std::string name;
  uint64_t elements = 0;
  uint64_t differing = 0;  // elements whose bits differ
  double max_abs_diff = 0;
  std::array<uint64_t, kUlpBuckets> ulp_histogram{};
  bool bitwise_equal() const { return differing == 0; }
};

struct ResultDiff {
  std::vector<TensorDiff> tensors;  // in BlockTensorNames() order
  bool bitwise_equal() const;
  const TensorDiff* Find(const std::string& name) const;
};

// The names of a BlockResult's tensors, as in the oracle file.
std::vector<std::string> BlockTensorNames();
// The raw little-endian bytes of one named tensor as stored for `precision` (F64 for f64, F32
// otherwise; topk_ids as I32). Empty for an unknown name.
std::vector<uint8_t> TensorBytes(const BlockResult& r, const std::string& name, Precision p);

ResultDiff CompareResults(const BlockResult& a, const BlockResult& b, Precision p);

// Relative error of `a` against reference `b`: max |a - b| / max |b| over one tensor.
double MaxRelativeError(std::span<const double> a, std::span<const double> b);

// Decimal string of a double with 17 significant digits (round-trips).
std::string ExactDecimal(double v);

nlohmann::json ToJson(const TensorDiff& d);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_RESULT_DIFF_H_
