#include "core/quant/dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/quant/x4t_container.h"

namespace ckpt::quant {
namespace {

double PlainValue(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return DecodeBF16(b);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
      double v = exp == 0 ? std::ldexp(man, -24)
                 : exp == 31 ? (man ? std::numeric_limits<double>::quiet_NaN()
                                    : std::numeric_limits<double>::infinity())
                             : std::ldexp(1024 + man, exp - 25);
      return (h & 0x8000) ? -v : v;
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<double>> DequantizeWeight(const QuantWeight& w) {
  std::vector<double> out(w.rows * w.cols);
  switch (w.kind) {
    case WeightKind::kPlain: {
      const int bytes = DTypeBits(w.packed.info->dtype) / 8;
      const uint8_t* p = w.packed.bytes().data();
      for (uint64_t i = 0; i < out.size(); ++i) out[i] = PlainValue(w.packed.info->dtype, p + i * bytes);
      return out;
    }
    case WeightKind::kMxfp4: {
      absl::StatusOr<Mxfp4View> v = Mxfp4ViewOf(w);
      if (!v.ok()) return v.status();
      for (uint64_t r = 0; r < w.rows; ++r)
        for (uint64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = v->Value(r, c);
      return out;
    }
    case WeightKind::kNvfp4: {
      absl::StatusOr<Nvfp4View> v = Nvfp4ViewOf(w);
      if (!v.ok()) return v.status();
      for (uint64_t r = 0; r < w.rows; ++r)
        for (uint64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = v->Value(r, c);
      return out;
    }
    case WeightKind::kX4T: {
      absl::StatusOr<X4TExpertMatrix> m = ReadX4TExpertMatrix(w);
      if (!m.ok()) return m.status();
      absl::StatusOr<Mxfp4View> v =
          Mxfp4View::Make(w.module, m->weight_packed, m->weight_scale, w.rows, w.cols);
      if (!v.ok()) return v.status();
      for (uint64_t r = 0; r < w.rows; ++r)
        for (uint64_t c = 0; c < w.cols; ++c) out[r * w.cols + c] = v->Value(r, c);
      return out;
    }
  }
  return absl::InternalError("unknown weight kind");
}

absl::StatusOr<std::vector<double>> DequantizeWeight(const Checkpoint& ckpt,
                                                     const std::string& module,
                                                     std::array<uint64_t, 2>* shape) {
  absl::StatusOr<QuantWeight> w = ResolveWeight(ckpt, module);
  if (!w.ok()) return w.status();
  if (shape) *shape = {w->rows, w->cols};
  return DequantizeWeight(*w);
}

std::vector<uint8_t> Float32Bytes(const std::vector<double>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    std::memcpy(&out[i * 4], &f, 4);
  }
  return out;
}

}  // namespace ckpt::quant
