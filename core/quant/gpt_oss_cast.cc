#include "core/quant/gpt_oss_cast.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"
#include "core/quant/fp4_tensor.h"

namespace ckpt::quant::gptoss {

absl::StatusOr<ModelOptFused> CastToModelOpt(const std::string& name, const Dims& d, Fused f,
                                             std::span<const uint8_t> blocks,
                                             std::span<const uint8_t> scales) {
  const uint64_t E = d.experts, R = d.Rows(f), C = d.Cols(f), G = C / 32;
  // [E, R, C/32, 16] is an [E*R, C] MXFP4 matrix.
  absl::StatusOr<Mxfp4View> v = Mxfp4View::Make(name, blocks, scales, E * R, C);
  if (!v.ok()) return v.status();
  std::optional<int> k_max;
  for (uint64_t r = 0; r < E * R; ++r) {
    for (uint64_t g = 0; g < G; ++g) {
      if (v->GroupActive(r, g) && v->ScaleByte(r, g) != kE8M0NaN) {
        k_max = std::max(k_max.value_or(-127), E8M0Exponent(v->ScaleByte(r, g)));
      }
    }
  }
  ModelOptFused out;
  out.k_max = k_max.value_or(0);
  const int m = k_max ? *k_max - 8 : 0;
  out.weight_scale_2 = std::ldexp(1.0f, m);
  out.packed.assign(E * R * C / 2, 0);
  out.scales.assign(E * R * C / 16, 0);
  for (uint64_t e = 0; e < E; ++e) {
    for (uint64_t r = 0; r < R; ++r) {
      for (uint64_t g = 0; g < G; ++g) {
        const uint64_t row = e * R + r;
        const uint8_t s = v->ScaleByte(row, g);
        if (!v->GroupActive(row, g)) {
          ++out.zero_groups;
        } else {
          const int byte = s == kE8M0NaN ? -1 : EncodeE4M3PowerOfTwo(E8M0Exponent(s) - m);
          if (byte < 0) {
            return absl::FailedPreconditionError(absl::StrCat(
                name, " expert ", e, ", ", ProjectionName(ProjectionOfRow(f, r)), " row ",
                ProjectionRow(f, r), ", block ", g, ": scale byte ", s, " is outside the window ",
                "of k_max ", out.k_max, " (the cast would be lossy)"));
          }
          for (uint64_t h = 0; h < 2; ++h) {
            out.scales[ModelOptPosition(d, f, {e, r, g * 32 + 16 * h}).scale] =
                static_cast<uint8_t>(byte);
          }
        }
        // One source byte holds columns 2k and 2k + 1 of the row, as one ModelOpt byte does.
        for (uint64_t i = 0; i < 16; ++i) {
          out.packed[ModelOptPosition(d, f, {e, r, g * 32 + 2 * i}).code.byte] =
              blocks[Mxfp4Position(d, f, {e, r, g * 32 + 2 * i}).code.byte];
        }
      }
    }
  }
  return out;
}

}  // namespace ckpt::quant::gptoss
