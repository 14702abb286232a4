#include "core/quant/fp4_tensor.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::quant {
namespace {

absl::Status CheckSizes(const std::string& name, uint64_t packed, uint64_t scales, uint64_t rows,
                        uint64_t cols, uint64_t group) {
  if (cols % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", cols, " columns is not a multiple of the group size ", group));
  }
  if (packed != rows * cols / 2 || scales != rows * cols / group) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": [", rows, ", ", cols, "] with group ", group, " needs ", rows * cols / 2,
        " packed and ", rows * cols / group, " scale bytes, got ", packed, " and ", scales));
  }
  return absl::OkStatus();
}

}  // namespace

std::string GlobalRoleName(GlobalRole role) {
  return role == GlobalRole::kDivisor ? "divisor" : "multiplier";
}

bool PackedFp4::AnyNonzero(uint64_t r, uint64_t c0, uint64_t n) const {
  const uint8_t* p = packed_.data() + r * (cols_ / 2) + c0 / 2;
  uint64_t i = 0;
  // Eight bytes at a time: the magnitude bits of both nibbles are 0x77.
  for (; i + 8 <= n / 2; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w & 0x7777777777777777ull) return true;
  }
  for (; i < n / 2; ++i) {
    if (p[i] & 0x77) return true;
  }
  return false;
}

absl::StatusOr<Mxfp4View> Mxfp4View::Make(const std::string& name,
                                          std::span<const uint8_t> packed,
                                          std::span<const uint8_t> scales, uint64_t rows,
                                          uint64_t cols, NibbleOrder order) {
  if (absl::Status s = CheckSizes(name, packed.size(), scales.size(), rows, cols, kGroup);
      !s.ok()) {
    return s;
  }
  Mxfp4View v;
  v.codes_ = PackedFp4(packed, rows, cols, order);
  v.scales_ = scales;
  return v;
}

absl::StatusOr<Nvfp4View> Nvfp4View::Make(const std::string& name,
                                          std::span<const uint8_t> packed,
                                          std::span<const uint8_t> scales, Nvfp4Global global,
                                          uint64_t rows, uint64_t cols, NibbleOrder order) {
  if (absl::Status s = CheckSizes(name, packed.size(), scales.size(), rows, cols, kBlock);
      !s.ok()) {
    return s;
  }
  if (!std::isfinite(global.value) || global.value == 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": global scale (", GlobalRoleName(global.role), ") is zero or not finite"));
  }
  Nvfp4View v;
  v.codes_ = PackedFp4(packed, rows, cols, order);
  v.scales_ = scales;
  v.global_ = global;
  return v;
}

}  // namespace ckpt::quant
