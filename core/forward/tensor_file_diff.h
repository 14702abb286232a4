// `ckpt-audit diff A.safetensors B.safetensors`: the per-tensor comparison of the forward audit
// (bitwise equality, differing elements, max |diff|, ULP histograms; core/forward/result_diff.h)
// for two safetensors files, e.g. activations a serving engine captured against the reference
// output `ckpt-audit forward --output` wrote (docs/forward.md "Comparing captured activations").
//
// Tensors are matched by name. Equal dtypes compare bits and count ULPs in that dtype; two
// different float dtypes (F64, F32, BF16, F16) are compared in the coarser one, both sides
// rounded to it (to nearest even); integer and other dtypes compare element bytes only.
#ifndef CKPT_CORE_FORWARD_TENSOR_FILE_DIFF_H_
#define CKPT_CORE_FORWARD_TENSOR_FILE_DIFF_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/io/tree_image.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

struct FileDiffResult {
  // schema ckpt-audit.tensor-diff/1: per tensor "compared" with the TensorDiff fields and the
  // dtype it was compared in, or "only_in_a" / "only_in_b" / "shape_differs" /
  // "dtype_not_comparable"; counts; verdict "identical" or "different". No floating-point
  // numbers (magnitudes are decimal strings).
  nlohmann::json report;
  bool identical = false;  // same tensor names and shapes, every element equal
};

// Both files are read once, holding at most `memory_window` bytes of them (headers and the
// pairs of tensors being compared; core/io/tree_stream.h). Errors when a file cannot be read as
// safetensors (the strict reader's message) or is not named *.safetensors, RESOURCE_EXHAUSTED
// when one pair of tensors does not fit the window, DATA_LOSS when a file changes meanwhile.
absl::StatusOr<FileDiffResult> DiffTensorFiles(const std::string& a, const std::string& b,
                                               uint64_t memory_window = kDefaultMemoryWindow);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_TENSOR_FILE_DIFF_H_
