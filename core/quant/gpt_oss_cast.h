// The lossless cast of one gpt-oss stacked expert tensor from transformers' MXFP4 layout to
// ModelOpt's NVFP4 export (docs/quant.md "gpt-oss layouts"): nothing is requantized. k_max is
// taken over the active 32-groups of all experts (all-zero groups do not count, whatever their
// scale byte); weight_scale_2 = 2^(k_max - 8); both 16-block scales of an active group are
// E4M3 2^(k_j - k_max + 8); all-zero groups get +0; codes are copied into the transposed
// layout. A transcoder casts one expert at a time (ModelOptCaster), holding one expert's
// output; pair verification (gpt_oss_pair.h) checks its output.
#ifndef CKPT_CORE_QUANT_GPT_OSS_CAST_H_
#define CKPT_CORE_QUANT_GPT_OSS_CAST_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/quant/fp4_tensor.h"
#include "core/quant/gpt_oss_layout.h"

namespace ckpt::quant::gptoss {

// The cast of one stacked tensor, expert by expert. In ModelOpt's layout expert e's codes are
// bytes [e, e + 1) x C/2 x R of `X` and its block scales [e, e + 1) x C/16 x R of
// `X_weight_scale`, so each expert's output is one contiguous slice of each.
class ModelOptCaster {
 public:
  // `blocks` [E, R, C/2] and `scales` [E, R, C/32] bytes of tensor `name` (borrowed; they must
  // outlive the caster). INVALID_ARGUMENT when their sizes do not fit `d`.
  static absl::StatusOr<ModelOptCaster> Make(const std::string& name, const Dims& d, Fused f,
                                             std::span<const uint8_t> blocks,
                                             std::span<const uint8_t> scales);
  int k_max() const { return k_max_; }                    // 0 when no group is active
  float weight_scale_2() const { return weight_scale_2_; }  // 1 when no group is active
  uint64_t expert_packed_bytes() const { return d_.Cols(f_) / 2 * d_.Rows(f_); }
  uint64_t expert_scale_bytes() const { return d_.Cols(f_) / 16 * d_.Rows(f_); }
  // Expert e's codes ([C/2, R]) and block scales ([C/16, R]) into `packed` and `scales` (of
  // those sizes); returns its all-zero groups. FAILED_PRECONDITION naming tensor, expert, row and
  // block when an active group's scale is NaN or k_max - k_j > 17 (the cast would be lossy).
  absl::StatusOr<uint64_t> CastExpert(uint64_t e, std::span<uint8_t> packed,
                                      std::span<uint8_t> scales) const;

 private:
  ModelOptCaster(std::string name, const Dims& d, Fused f, Mxfp4View v)
      : name_(std::move(name)), d_(d), f_(f), v_(std::move(v)) {}
  std::string name_;
  Dims d_;
  Fused f_;
  Mxfp4View v_;
  int k_max_ = 0;
  float weight_scale_2_ = 1.0f;
};

struct ModelOptFused {
  std::vector<uint8_t> packed;  // [E, C/2, R]
  std::vector<uint8_t> scales;  // F8_E4M3 [E, C/16, R]
  float weight_scale_2 = 1.0f;  // 1 when no group is active
  int k_max = 0;                // 0 when no group is active
  uint64_t zero_groups = 0;     // all-zero 32-groups (scale +0)
};

// The whole stacked tensor at once (every expert through ModelOptCaster); errors as its.
absl::StatusOr<ModelOptFused> CastToModelOpt(const std::string& name, const Dims& d, Fused f,
                                             std::span<const uint8_t> blocks,
                                             std::span<const uint8_t> scales);

}  // namespace ckpt::quant::gptoss

#endif  // CKPT_CORE_QUANT_GPT_OSS_CAST_H_
