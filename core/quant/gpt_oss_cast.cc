#include "core/quant/gpt_oss_cast.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"

namespace ckpt::quant::gptoss {

absl::StatusOr<ModelOptCaster> ModelOptCaster::Make(const std::string& name, const Dims& d,
                                                    Fused f, std::span<const uint8_t> blocks,
                                                    std::span<const uint8_t> scales) {
  // [E, R, C/32, 16] is an [E*R, C] MXFP4 matrix.
  absl::StatusOr<Mxfp4View> v = Mxfp4View::Make(name, blocks, scales, d.experts * d.Rows(f),
                                                d.Cols(f));
  if (!v.ok()) return v.status();
  ModelOptCaster c(name, d, f, *std::move(v));
  std::optional<int> k_max;
  for (uint64_t r = 0; r < c.v_.rows(); ++r) {
    for (uint64_t g = 0; g < c.v_.groups_per_row(); ++g) {
      if (c.v_.GroupActive(r, g) && c.v_.ScaleByte(r, g) != kE8M0NaN) {
        k_max = std::max(k_max.value_or(-127), E8M0Exponent(c.v_.ScaleByte(r, g)));
      }
    }
  }
  c.k_max_ = k_max.value_or(0);
  c.weight_scale_2_ = std::ldexp(1.0f, k_max ? *k_max - 8 : 0);
  return c;
}

absl::StatusOr<uint64_t> ModelOptCaster::CastExpert(uint64_t e, std::span<uint8_t> packed,
                                                    std::span<uint8_t> scales) const {
  const uint64_t R = d_.Rows(f_), G = d_.Cols(f_) / 32;
  if (e >= d_.experts || packed.size() != expert_packed_bytes() ||
      scales.size() != expert_scale_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, " expert ", e, ": output sizes ",
                                                   packed.size(), " and ", scales.size()));
  }
  // Positions are of the stacked tensor; expert e's slices start here.
  const uint64_t packed0 = e * expert_packed_bytes(), scale0 = e * expert_scale_bytes();
  const int m = k_max_ - 8;
  std::fill(packed.begin(), packed.end(), 0);
  std::fill(scales.begin(), scales.end(), 0);
  uint64_t zero_groups = 0;
  for (uint64_t r = 0; r < R; ++r) {
    for (uint64_t g = 0; g < G; ++g) {
      const uint64_t row = e * R + r;
      const uint8_t s = v_.ScaleByte(row, g);
      if (!v_.GroupActive(row, g)) {
        ++zero_groups;
      } else {
        const int byte = s == kE8M0NaN ? -1 : EncodeE4M3PowerOfTwo(E8M0Exponent(s) - m);
        if (byte < 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              name_, " expert ", e, ", ", ProjectionName(ProjectionOfRow(f_, r)), " row ",
              ProjectionRow(f_, r), ", block ", g, ": scale byte ", s, " is outside the window ",
              "of k_max ", k_max_, " (the cast would be lossy)"));
        }
        for (uint64_t h = 0; h < 2; ++h) {
          scales[ModelOptPosition(d_, f_, {e, r, g * 32 + 16 * h}).scale - scale0] =
              static_cast<uint8_t>(byte);
        }
      }
      // One source byte holds columns 2k and 2k + 1 of the row, as one ModelOpt byte does.
      for (uint64_t i = 0; i < 16; ++i) {
        const FusedElement x{e, r, g * 32 + 2 * i};
        packed[ModelOptPosition(d_, f_, x).code.byte - packed0] =
            v_.codes().bytes()[Mxfp4Position(d_, f_, x).code.byte];
      }
    }
  }
  return zero_groups;
}

absl::StatusOr<ModelOptFused> CastToModelOpt(const std::string& name, const Dims& d, Fused f,
                                             std::span<const uint8_t> blocks,
                                             std::span<const uint8_t> scales) {
  absl::StatusOr<ModelOptCaster> c = ModelOptCaster::Make(name, d, f, blocks, scales);
  if (!c.ok()) return c.status();
  ModelOptFused out;
  out.k_max = c->k_max();
  out.weight_scale_2 = c->weight_scale_2();
  const uint64_t pe = c->expert_packed_bytes(), se = c->expert_scale_bytes();
  out.packed.assign(d.experts * pe, 0);
  out.scales.assign(d.experts * se, 0);
  for (uint64_t e = 0; e < d.experts; ++e) {
    absl::StatusOr<uint64_t> z = c->CastExpert(e, std::span(out.packed).subspan(e * pe, pe),
                                               std::span(out.scales).subspan(e * se, se));
    if (!z.ok()) return z.status();
    out.zero_groups += *z;
  }
  return out;
}

}  // namespace ckpt::quant::gptoss
