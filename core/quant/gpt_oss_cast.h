// The lossless cast of one gpt-oss stacked expert tensor from transformers' MXFP4 layout to
// ModelOpt's NVFP4 export (docs/quant.md "gpt-oss layouts"): nothing is requantized. k_max is
// taken over the active 32-groups of all experts (all-zero groups do not count, whatever their
// scale byte); weight_scale_2 = 2^(k_max - 8); both 16-block scales of an active group are
// E4M3 2^(k_j - k_max + 8); all-zero groups get +0; codes are copied into the transposed
// layout. A transcoder calls it once per stacked tensor; pair verification (gpt_oss_pair.h)
// checks its output.
#ifndef CKPT_CORE_QUANT_GPT_OSS_CAST_H_
#define CKPT_CORE_QUANT_GPT_OSS_CAST_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/quant/gpt_oss_layout.h"

namespace ckpt::quant::gptoss {

struct ModelOptFused {
  std::vector<uint8_t> packed;  // [E, C/2, R]
  std::vector<uint8_t> scales;  // F8_E4M3 [E, C/16, R]
  float weight_scale_2 = 1.0f;  // 1 when no group is active
  int k_max = 0;                // 0 when no group is active
  uint64_t zero_groups = 0;     // all-zero 32-groups (scale +0)
};

// `blocks` [E, R, C/2] and `scales` [E, R, C/32] bytes of tensor `name`. INVALID_ARGUMENT when
// their sizes do not fit `d`; FAILED_PRECONDITION naming expert, row and block (the MXFP4
// 32-group, gpt-oss's `_blocks` axis) when an active group's scale is NaN or k_max - k_j > 17
// (the cast would be lossy).
absl::StatusOr<ModelOptFused> CastToModelOpt(const std::string& name, const Dims& d, Fused f,
                                             std::span<const uint8_t> blocks,
                                             std::span<const uint8_t> scales);

}  // namespace ckpt::quant::gptoss

#endif  // CKPT_CORE_QUANT_GPT_OSS_CAST_H_
