#include "core/quant/gpt_oss_layout.h"

#include "absl/strings/str_cat.h"

namespace ckpt::quant::gptoss {

std::string FusedName(Fused f) { return f == Fused::kGateUp ? "gate_up_proj" : "down_proj"; }

std::string ProjectionName(Projection p) {
  return p == Projection::kGate ? "gate" : p == Projection::kUp ? "up" : "down";
}

Fused FusedOf(Projection p) { return p == Projection::kDown ? Fused::kDown : Fused::kGateUp; }

absl::StatusOr<Dims> DimsFromConfig(const nlohmann::json& tc) {
  Dims d;
  for (const auto& [key, field] :
       {std::pair<const char*, uint64_t*>{"num_local_experts", &d.experts},
        {"hidden_size", &d.hidden},
        {"intermediate_size", &d.intermediate}}) {
    const nlohmann::json* v = tc.is_object() && tc.contains(key) ? &tc[key] : nullptr;
    if (!v || !v->is_number_integer() || v->get<int64_t>() <= 0 ||
        v->get<int64_t>() > (int64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpt-oss config: ", key, " must be an integer in [1, 2^32]"));
    }
    *field = v->get<uint64_t>();
  }
  if (d.hidden % 32 || d.intermediate % 32) {
    return absl::InvalidArgumentError(absl::StrCat("gpt-oss config: hidden_size ", d.hidden,
                                                   " and intermediate_size ", d.intermediate,
                                                   " must be multiples of 32"));
  }
  return d;
}

FusedElement ToFused(Projection p, uint64_t expert, uint64_t row, uint64_t col) {
  switch (p) {
    case Projection::kGate:
      return {expert, 2 * row, col};
    case Projection::kUp:
      return {expert, 2 * row + 1, col};
    case Projection::kDown:
      return {expert, row, col};
  }
  return {};
}

Projection ProjectionOfRow(Fused f, uint64_t fused_row) {
  if (f == Fused::kDown) return Projection::kDown;
  return fused_row % 2 == 0 ? Projection::kGate : Projection::kUp;
}

uint64_t ProjectionRow(Fused f, uint64_t fused_row) {
  return f == Fused::kDown ? fused_row : fused_row / 2;
}

ElementAt Mxfp4Position(const Dims& d, Fused f, const FusedElement& x) {
  // [E, R, C/32, 16] is [E, R, C/2] bytes; scales [E, R, C/32].
  const uint64_t R = d.Rows(f), C = d.Cols(f);
  const uint64_t row = x.expert * R + x.row;
  return {{row * (C / 2) + x.col / 2, x.col % 2 == 1}, row * (C / 32) + x.col / 32};
}

ElementAt ModelOptPosition(const Dims& d, Fused f, const FusedElement& x) {
  // [E, C/2, R] bytes and [E, C/16, R] scales: the fused row is the fastest axis.
  const uint64_t R = d.Rows(f), C = d.Cols(f);
  return {{(x.expert * (C / 2) + x.col / 2) * R + x.row, x.col % 2 == 1},
          (x.expert * (C / 16) + x.col / 16) * R + x.row};
}

std::vector<TensorSpec> Mxfp4Tensors(const std::string& prefix, const Dims& d, Fused f,
                                     DType bias_dtype) {
  const std::string base = prefix + FusedName(f);
  const uint64_t E = d.experts, R = d.Rows(f), C = d.Cols(f);
  return {{base + "_blocks", DType::kU8, {E, R, C / 32, 16}},
          {base + "_scales", DType::kU8, {E, R, C / 32}},
          {base + "_bias", bias_dtype, {E, R}}};
}

std::vector<TensorSpec> ModelOptTensors(const std::string& prefix, const Dims& d, Fused f,
                                        bool w4a4, DType bias_dtype) {
  const std::string base = prefix + FusedName(f);
  const uint64_t E = d.experts, R = d.Rows(f), C = d.Cols(f);
  std::vector<TensorSpec> out = {{base, DType::kU8, {E, C / 2, R}},
                                 {base + "_weight_scale", DType::kF8_E4M3, {E, C / 16, R}},
                                 {base + "_weight_scale_2", DType::kF32, {}}};
  if (w4a4) out.push_back({base + "_input_scale", DType::kF32, {}});
  out.push_back({base + "_bias", bias_dtype, {E, R}});
  return out;
}

}  // namespace ckpt::quant::gptoss
