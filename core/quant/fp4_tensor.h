// Zero-copy views of FP4 weight matrices inside mapped checkpoint bytes (docs/formats.md §4):
// MXFP4 (E2M1 codes, one E8M0 scale per 32 elements of a row) and NVFP4 (E2M1 codes, one
// E4M3 scale per 16 elements and a per-tensor F32 global scale, which compressed-tensors
// stores as a divisor and ModelOpt as a multiplier: docs/formats.md §4, §9).
//
// Packing: two codes per byte, [rows, cols/2]. Every format we read stores the even element in
// the LOW nibble (gpt-oss, compressed-tensors, ModelOpt); NibbleOrder::kHighFirst exists so tests can show
// that the other order does not reproduce the oracle. A view only borrows the spans: the
// Checkpoint that maps them must outlive it.
#ifndef CKPT_CORE_QUANT_FP4_TENSOR_H_
#define CKPT_CORE_QUANT_FP4_TENSOR_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "core/quant/codecs.h"

namespace ckpt::quant {

enum class NibbleOrder { kLowFirst, kHighFirst };

// The E2M1 codes of a packed [rows, cols] matrix.
class PackedFp4 {
 public:
  PackedFp4() = default;
  PackedFp4(std::span<const uint8_t> packed, uint64_t rows, uint64_t cols, NibbleOrder order)
      : packed_(packed), rows_(rows), cols_(cols), order_(order) {}
  uint64_t rows() const { return rows_; }
  uint64_t cols() const { return cols_; }
  std::span<const uint8_t> bytes() const { return packed_; }
  uint8_t Code(uint64_t r, uint64_t c) const {
    const uint8_t b = packed_[r * (cols_ / 2) + c / 2];
    const bool low = (c % 2 == 0) == (order_ == NibbleOrder::kLowFirst);
    return low ? LowNibble(b) : HighNibble(b);
  }
  // True when elements [c0, c0 + n) of row r (c0, n even) hold any nonzero magnitude.
  bool AnyNonzero(uint64_t r, uint64_t c0, uint64_t n) const;

 private:
  std::span<const uint8_t> packed_;
  uint64_t rows_ = 0, cols_ = 0;
  NibbleOrder order_ = NibbleOrder::kLowFirst;
};

class Mxfp4View {
 public:
  static constexpr uint64_t kGroup = 32;
  // INVALID_ARGUMENT (naming `name`) unless cols % 32 == 0 and the spans have
  // rows*cols/2 and rows*cols/32 bytes.
  static absl::StatusOr<Mxfp4View> Make(const std::string& name, std::span<const uint8_t> packed,
                                        std::span<const uint8_t> scales, uint64_t rows,
                                        uint64_t cols,
                                        NibbleOrder order = NibbleOrder::kLowFirst);
  const PackedFp4& codes() const { return codes_; }
  std::span<const uint8_t> scales() const { return scales_; }
  uint64_t rows() const { return codes_.rows(); }
  uint64_t cols() const { return codes_.cols(); }
  uint64_t groups_per_row() const { return cols() / kGroup; }
  uint8_t ScaleByte(uint64_t r, uint64_t g) const { return scales_[r * groups_per_row() + g]; }
  bool GroupActive(uint64_t r, uint64_t g) const { return codes_.AnyNonzero(r, g * kGroup, kGroup); }
  // fp4 * 2^(scale-127); NaN where the scale byte is 0xFF.
  double Value(uint64_t r, uint64_t c) const {
    return DecodeE2M1(codes_.Code(r, c)) * DecodeE8M0(ScaleByte(r, c / kGroup));
  }

 private:
  PackedFp4 codes_;
  std::span<const uint8_t> scales_;
};

// What an NVFP4 per-tensor global scale means. compressed-tensors' `weight_global_scale` is a
// divisor (value = e2m1 * e4m3 / g, docs/formats.md §4); ModelOpt's `weight_scale_2` is a
// multiplier (value = e2m1 * e4m3 * g, docs/formats.md §9). The same float is a different
// weight under the two readings, so every consumer takes the role with the value.
enum class GlobalRole { kDivisor, kMultiplier };
std::string GlobalRoleName(GlobalRole role);  // "divisor" | "multiplier"

struct Nvfp4Global {
  float value = 1.0f;
  GlobalRole role = GlobalRole::kDivisor;
  // A block scale (decoded E4M3) as the weight sees it: s / g or s * g, in double. Exact
  // whenever g is a power of two and the result is a normal double.
  double Apply(double block_scale) const {
    return role == GlobalRole::kDivisor ? block_scale / static_cast<double>(value)
                                        : block_scale * static_cast<double>(value);
  }
  bool operator==(const Nvfp4Global&) const = default;
};

class Nvfp4View {
 public:
  static constexpr uint64_t kBlock = 16;
  // INVALID_ARGUMENT unless cols % 16 == 0 and the spans have rows*cols/2 and rows*cols/16
  // bytes; the global scale must be finite and nonzero.
  static absl::StatusOr<Nvfp4View> Make(const std::string& name, std::span<const uint8_t> packed,
                                        std::span<const uint8_t> scales, Nvfp4Global global,
                                        uint64_t rows, uint64_t cols,
                                        NibbleOrder order = NibbleOrder::kLowFirst);
  const PackedFp4& codes() const { return codes_; }
  std::span<const uint8_t> scales() const { return scales_; }
  const Nvfp4Global& global() const { return global_; }
  uint64_t rows() const { return codes_.rows(); }
  uint64_t cols() const { return codes_.cols(); }
  uint64_t blocks_per_row() const { return cols() / kBlock; }
  uint8_t ScaleByte(uint64_t r, uint64_t b) const { return scales_[r * blocks_per_row() + b]; }
  // The block's effective scale: weight_scale with the global applied in its role.
  double BlockScale(uint64_t r, uint64_t b) const {
    return global_.Apply(DecodeE4M3(ScaleByte(r, b)));
  }
  double Value(uint64_t r, uint64_t c) const {
    return DecodeE2M1(codes_.Code(r, c)) * BlockScale(r, c / kBlock);
  }

 private:
  PackedFp4 codes_;
  std::span<const uint8_t> scales_;
  Nvfp4Global global_;
};

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_FP4_TENSOR_H_
