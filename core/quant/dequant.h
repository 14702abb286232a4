// Dequantization of one weight matrix to exact values, whatever its storage (MXFP4, NVFP4,
// X4T, or a plain BF16/F16/F32 weight). Shared by the pair verifier's tests, the oracle tests
// and the reference block forward.
#ifndef CKPT_CORE_QUANT_DEQUANT_H_
#define CKPT_CORE_QUANT_DEQUANT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/quant/quant_weight.h"

namespace ckpt::quant {

// Row-major [out, in] values of `module` (e.g. "...experts.E.w1"): MXFP4 fp4 * 2^(s-127);
// NVFP4 fp4 * weight_scale / weight_global_scale; X4T as the MXFP4 it encodes. Every value is
// exact in double. `shape`, when given, receives {out, in}.
absl::StatusOr<std::vector<double>> DequantizeWeight(const Checkpoint& ckpt,
                                                     const std::string& module,
                                                     std::array<uint64_t, 2>* shape = nullptr);
absl::StatusOr<std::vector<double>> DequantizeWeight(const QuantWeight& w);

// Float32 little-endian bytes of the values (the oracle's digest input).
std::vector<uint8_t> Float32Bytes(const std::vector<double>& values);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_DEQUANT_H_
