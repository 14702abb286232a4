// Where each FP4 element of a gpt-oss expert projection lives on disk, in the two layouts that
// store gpt-oss experts stacked (docs/quant.md "gpt-oss layouts", docs/formats.md §10):
//
//   transformers MXFP4   X_blocks U8 [E, R, C/32, 16], X_scales U8 E8M0 [E, R, C/32]
//   ModelOpt NVFP4       X U8 [E, C/2, R], X_weight_scale F8_E4M3 [E, C/16, R],
//                        X_weight_scale_2 F32 0-d (one multiplier for all experts),
//                        X_input_scale F32 0-d (W4A4 only)
//
// with X = gate_up_proj (R = 2I fused rows, C = H) or down_proj (R = H, C = I), and the bias
// X_bias [E, R] in both. Gate and up share the fused rows: gate row r is fused row 2r, up row r
// is 2r + 1. In both layouts two elements share a byte, the even column in the LOW nibble; the
// ModelOpt tensors are the MXFP4 ones with the last two axes swapped (quantized along C, then
// transposed back), so one byte still holds columns 2k and 2k + 1 of one fused row.
#ifndef CKPT_CORE_QUANT_GPT_OSS_LAYOUT_H_
#define CKPT_CORE_QUANT_GPT_OSS_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant::gptoss {

// The two stacked tensors of a layer's experts, and the three matrices they hold.
enum class Fused { kGateUp, kDown };
enum class Projection { kGate, kUp, kDown };
std::string FusedName(Fused f);            // "gate_up_proj" | "down_proj"
std::string ProjectionName(Projection p);  // "gate" | "up" | "down"
Fused FusedOf(Projection p);

struct Dims {
  uint64_t experts = 0, hidden = 0, intermediate = 0;  // E, H, I

  uint64_t Rows(Fused f) const { return f == Fused::kGateUp ? 2 * intermediate : hidden; }
  uint64_t Cols(Fused f) const { return f == Fused::kGateUp ? hidden : intermediate; }
};
// num_local_experts, hidden_size, intermediate_size of a gpt-oss config; INVALID_ARGUMENT
// unless all are in [1, 2^32] and H, I are multiples of 32.
absl::StatusOr<Dims> DimsFromConfig(const nlohmann::json& text_config);

// One element of a fused tensor: expert, fused row, column (the input index).
struct FusedElement {
  uint64_t expert = 0, row = 0, col = 0;
};
// Element (row, col) of projection p of expert e, with row < out and col < in of p ([I, H] for
// gate and up, [H, I] for down).
FusedElement ToFused(Projection p, uint64_t expert, uint64_t row, uint64_t col);
// The projection and its row that a fused row belongs to.
Projection ProjectionOfRow(Fused f, uint64_t fused_row);
uint64_t ProjectionRow(Fused f, uint64_t fused_row);

// A nibble: byte index in its tensor and whether it is the high nibble.
struct NibbleAt {
  uint64_t byte = 0;
  bool high = false;
  bool operator==(const NibbleAt&) const = default;
};
// An element's code and scale, as indices into the packed and scale tensors.
struct ElementAt {
  NibbleAt code;
  uint64_t scale = 0;
  bool operator==(const ElementAt&) const = default;
};
ElementAt Mxfp4Position(const Dims& d, Fused f, const FusedElement& x);     // 32-element groups
ElementAt ModelOptPosition(const Dims& d, Fused f, const FusedElement& x);  // 16-element blocks

// Tensor names and shapes of one layer's experts (prefix "model.layers.L.mlp.experts.").
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
};
// X_blocks, X_scales, X_bias (bias in `bias_dtype`: the checkpoints ship BF16).
std::vector<TensorSpec> Mxfp4Tensors(const std::string& prefix, const Dims& d, Fused f,
                                     DType bias_dtype);
// X, X_weight_scale, X_weight_scale_2, X_input_scale (when w4a4), X_bias.
std::vector<TensorSpec> ModelOptTensors(const std::string& prefix, const Dims& d, Fused f,
                                        bool w4a4, DType bias_dtype);

}  // namespace ckpt::quant::gptoss

#endif  // CKPT_CORE_QUANT_GPT_OSS_LAYOUT_H_
