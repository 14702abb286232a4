#include "core/quant/x4t_codec.h"

#include <array>

#include "absl/strings/str_cat.h"

namespace ckpt::quant {
namespace {

absl::Status CheckGeometry(uint32_t rows, uint32_t cols) {
  if (rows == 0 || rows % 16 != 0 || cols < 1 || cols > 255 ||
      static_cast<uint64_t>(rows) * cols >= (1u << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "X4T scale plane [", rows, ", ", cols,
        "]: needs rows % 16 == 0, 1 <= cols <= 255 and rows * cols < 2^24"));
  }
  return absl::OkStatus();
}

uint32_t SelectorBytes(uint32_t cols) { return (cols + 7) / 8; }

// The b in 0..254 maximizing count(b) + count(b+1); the lowest such b on ties.
uint8_t RowBase(const uint8_t* row, uint32_t cols) {
  std::array<uint32_t, 256> count{};
  for (uint32_t c = 0; c < cols; ++c) count[row[c]]++;
  uint32_t best = 0, best_b = 0;
  for (uint32_t b = 0; b < 255; ++b) {
    uint32_t n = count[b] + count[b + 1];
    if (n > best) best = n, best_b = b;
  }
  return static_cast<uint8_t>(best_b);
}

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

}  // namespace

uint64_t X4TFixedStreamBytes(uint32_t rows, uint32_t cols) {
  return static_cast<uint64_t>(rows / 16) * (16 + 16ull * SelectorBytes(cols));
}

absl::StatusOr<X4TScalePlane> EncodeX4TScalePlane(std::span<const uint8_t> plane, uint32_t rows,
                                                  uint32_t cols) {
  if (absl::Status s = CheckGeometry(rows, cols); !s.ok()) return s;
  if (plane.size() != static_cast<uint64_t>(rows) * cols) {
    return absl::InvalidArgumentError(absl::StrCat("X4T scale plane [", rows, ", ", cols,
                                                   "] given ", plane.size(), " bytes"));
  }
  const uint32_t sb = SelectorBytes(cols);
  X4TScalePlane out;
  out.fixed.assign(X4TFixedStreamBytes(rows, cols), 0);
  for (uint32_t tile = 0; tile < rows / 16; ++tile) {
    uint8_t* bases = out.fixed.data() + static_cast<uint64_t>(tile) * (16 + 16 * sb);
    uint8_t* selectors = bases + 16;
    for (uint32_t i = 0; i < 16; ++i) {
      const uint32_t r = tile * 16 + i;
      const uint8_t* row = plane.data() + static_cast<uint64_t>(r) * cols;
      const uint8_t base = RowBase(row, cols);
      bases[i] = base;
      for (uint32_t c = 0; c < cols; ++c) {
        if (row[c] == base + 1) {
          selectors[i * sb + c / 8] |= static_cast<uint8_t>(1u << (c % 8));
        } else if (row[c] != base) {
          PutU32(out.exceptions, (r * cols + c) | (static_cast<uint32_t>(row[c]) << 24));
        }
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> DecodeX4TScalePlane(std::span<const uint8_t> fixed,
                                                         std::span<const uint8_t> exceptions,
                                                         uint32_t rows, uint32_t cols) {
  if (absl::Status s = CheckGeometry(rows, cols); !s.ok()) return s;
  if (fixed.size() != X4TFixedStreamBytes(rows, cols)) {
    return absl::DataLossError(absl::StrCat("X4T fixed stream is ", fixed.size(),
                                            " bytes; a [", rows, ", ", cols, "] plane needs ",
                                            X4TFixedStreamBytes(rows, cols)));
  }
  if (exceptions.size() % 4 != 0) {
    return absl::DataLossError(
        absl::StrCat("X4T exception stream is ", exceptions.size(), " bytes, not a u32 array"));
  }
  const uint32_t sb = SelectorBytes(cols);
  std::vector<uint8_t> plane(static_cast<uint64_t>(rows) * cols);
  for (uint32_t r = 0; r < rows; ++r) {
    const uint8_t* tile = fixed.data() + static_cast<uint64_t>(r / 16) * (16 + 16 * sb);
    const uint8_t base = tile[r % 16];
    const uint8_t* sel = tile + 16 + (r % 16) * sb;
    for (uint32_t c = 0; c < cols; ++c) {
      plane[static_cast<uint64_t>(r) * cols + c] = base + ((sel[c / 8] >> (c % 8)) & 1);
    }
  }
  int64_t previous = -1;
  for (size_t i = 0; i < exceptions.size() / 4; ++i) {
    const uint8_t* e = exceptions.data() + 4 * i;
    const uint32_t pos = e[0] | (e[1] << 8) | (static_cast<uint32_t>(e[2]) << 16);
    if (static_cast<int64_t>(pos) <= previous || pos >= plane.size()) {
      return absl::DataLossError(absl::StrCat("X4T exception ", i, ": position ", pos,
                                              " is out of order or past the plane end"));
    }
    previous = pos;
    plane[pos] = e[3];
  }
  // Canonical form: re-encoding must give the same bytes (base choice, selector padding, no
  // exception that the pair could express).
  absl::StatusOr<X4TScalePlane> again = EncodeX4TScalePlane(plane, rows, cols);
  if (!again.ok()) return again.status();
  if (again->fixed != std::vector<uint8_t>(fixed.begin(), fixed.end()) ||
      again->exceptions != std::vector<uint8_t>(exceptions.begin(), exceptions.end())) {
    for (uint32_t r = 0; r < rows; ++r) {
      const uint64_t t = static_cast<uint64_t>(r / 16) * (16 + 16 * sb);
      bool same = again->fixed[t + r % 16] == fixed[t + r % 16];
      for (uint32_t b = 0; b < sb; ++b) {
        same = same && again->fixed[t + 16 + (r % 16) * sb + b] == fixed[t + 16 + (r % 16) * sb + b];
      }
      if (!same) {
        return absl::DataLossError(
            absl::StrCat("X4T scale plane row ", r, ": not the canonical encoding"));
      }
    }
    return absl::DataLossError("X4T exception stream is not the canonical encoding");
  }
  return plane;
}

}  // namespace ckpt::quant
