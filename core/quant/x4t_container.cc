#include "core/quant/x4t_container.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/quant/x4t_codec.h"

namespace ckpt::quant {

std::vector<uint8_t> UnpermuteGroupMajor(std::span<const uint8_t> stored, uint64_t rows,
                                         uint64_t groups) {
  std::vector<uint8_t> out(rows * groups * 16);
  for (uint64_t g = 0; g < groups; ++g) {
    for (uint64_t r = 0; r < rows; ++r) {
      std::memcpy(&out[(r * groups + g) * 16], &stored[(g * rows + r) * 16], 16);
    }
  }
  return out;
}

std::vector<uint8_t> PermuteGroupMajor(std::span<const uint8_t> source, uint64_t rows,
                                       uint64_t groups) {
  std::vector<uint8_t> out(rows * groups * 16);
  for (uint64_t g = 0; g < groups; ++g) {
    for (uint64_t r = 0; r < rows; ++r) {
      std::memcpy(&out[(g * rows + r) * 16], &source[(r * groups + g) * 16], 16);
    }
  }
  return out;
}

absl::StatusOr<X4TExpertMatrix> ReadX4TExpertMatrix(const QuantWeight& w) {
  if (w.kind != WeightKind::kX4T) {
    return absl::InvalidArgumentError(absl::StrCat(w.module, ": not an X4T weight"));
  }
  if (w.cols % 32 != 0 || w.rows > UINT32_MAX || w.cols > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(w.module, ": [", w.rows, ", ", w.cols, "] is not a group-32 matrix"));
  }
  X4TExpertMatrix m;
  m.rows = static_cast<uint32_t>(w.rows);
  m.cols = static_cast<uint32_t>(w.cols);
  std::span<const uint8_t> packed = w.packed.bytes();
  if (w.w2_group_major) {
    m.weight_packed = UnpermuteGroupMajor(packed, w.rows, w.cols / 32);
  } else {
    m.weight_packed.assign(packed.begin(), packed.end());
  }
  absl::StatusOr<std::vector<uint8_t>> scale = DecodeX4TScalePlane(
      w.x4t_fixed.bytes(), w.x4t_exceptions.bytes(), m.rows, m.cols / 32);
  if (!scale.ok()) {
    return absl::Status(scale.status().code(),
                        absl::StrCat(w.module, kScaleSuffix, ": ", scale.status().message()));
  }
  m.weight_scale = *std::move(scale);
  return m;
}

absl::StatusOr<X4TExpertMatrix> ReadX4TExpertMatrix(const Checkpoint& ckpt,
                                                    const std::string& module) {
  absl::StatusOr<QuantWeight> w = ResolveWeight(ckpt, module);
  if (!w.ok()) return w.status();
  return ReadX4TExpertMatrix(*w);
}

}  // namespace ckpt::quant
