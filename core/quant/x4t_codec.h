// The X4T scale-plane codec `adjacent-pair-fixed-stream-u24-exceptions/1` (docs/formats.md §6,
// docs/quant.md): a lossless encoding of an E8M0 scale plane [rows, cols] as one base byte and
// one selector bit per element (value == base or base + 1), plus u32 exceptions for the rest.
//
// Only canonical encodings are accepted: the decoder re-encodes what it decoded and requires
// identical bytes, so two different byte strings never denote the same plane.
#ifndef CKPT_CORE_QUANT_X4T_CODEC_H_
#define CKPT_CORE_QUANT_X4T_CODEC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::quant {

inline constexpr char kX4TScaleCodec[] = "adjacent-pair-fixed-stream-u24-exceptions/1";

// An encoded plane: the fixed stream and the exceptions as little-endian u32 bytes.
struct X4TScalePlane {
  std::vector<uint8_t> fixed;
  std::vector<uint8_t> exceptions;
};

// Size of the fixed stream for a [rows, cols] plane: rows/16 tiles of 16 + 16*ceil(cols/8).
uint64_t X4TFixedStreamBytes(uint32_t rows, uint32_t cols);

// INVALID_ARGUMENT unless rows % 16 == 0, 1 <= cols <= 255, rows*cols < 2^24 and
// plane.size() == rows*cols.
absl::StatusOr<X4TScalePlane> EncodeX4TScalePlane(std::span<const uint8_t> plane, uint32_t rows,
                                                  uint32_t cols);

// The plane [rows, cols], row-major. INVALID_ARGUMENT for bad geometry; DATA_LOSS (naming the
// row or exception index) for a stream of the wrong size, unordered or out-of-range exception
// positions, or any non-canonical encoding.
absl::StatusOr<std::vector<uint8_t>> DecodeX4TScalePlane(std::span<const uint8_t> fixed,
                                                         std::span<const uint8_t> exceptions,
                                                         uint32_t rows, uint32_t cols);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_X4T_CODEC_H_
