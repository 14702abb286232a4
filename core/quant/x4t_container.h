// Reads one expert matrix out of an X4T container (docs/formats.md §6) as the source MXFP4
// tensors it encodes: `weight_packed` [out, in/2] (w2's group-major layout un-permuted when the
// container declares it) and the E8M0 `weight_scale` plane [out, in/32], decoded and checked
// for canonical form.
#ifndef CKPT_CORE_QUANT_X4T_CONTAINER_H_
#define CKPT_CORE_QUANT_X4T_CONTAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/quant/quant_weight.h"

namespace ckpt::quant {

struct X4TExpertMatrix {
  uint32_t rows = 0, cols = 0;         // logical [out, in]
  std::vector<uint8_t> weight_packed;  // [rows, cols/2], source (row-major) order
  std::vector<uint8_t> weight_scale;   // [rows, cols/32] E8M0
};

// `module` is e.g. "language_model.model.layers.1.block_sparse_moe.experts.0.w2".
// NOT_FOUND / INVALID_ARGUMENT for missing or mis-shaped tensors, DATA_LOSS for a scale stream
// that does not decode canonically (the message names the tensor).
absl::StatusOr<X4TExpertMatrix> ReadX4TExpertMatrix(const Checkpoint& ckpt,
                                                    const std::string& module);
absl::StatusOr<X4TExpertMatrix> ReadX4TExpertMatrix(const QuantWeight& w);

// stored[g, r, k] = source[r, 16g + k] for a [groups, rows, 16] group-major byte tensor.
std::vector<uint8_t> UnpermuteGroupMajor(std::span<const uint8_t> stored, uint64_t rows,
                                         uint64_t groups);
std::vector<uint8_t> PermuteGroupMajor(std::span<const uint8_t> source, uint64_t rows,
                                       uint64_t groups);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_X4T_CONTAINER_H_
