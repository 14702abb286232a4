// Scalar codecs for the FP4 formats (docs/formats.md §3). Exact: every value decodes to the
// double (or float) it denotes, so comparisons on decoded values are bit-exact.
#ifndef CKPT_CORE_QUANT_CODECS_H_
#define CKPT_CORE_QUANT_CODECS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ckpt::quant {

// E2M1 code = sign<<3 | magnitude index; code 8 is -0.
inline constexpr float kE2M1Magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float DecodeE2M1(uint8_t code) {
  float m = kE2M1Magnitude[code & 7];
  return (code & 8) ? -m : m;
}

// Two E2M1 codes per byte; the LOW nibble is the even (first) element.
inline uint8_t LowNibble(uint8_t byte) { return byte & 0x0F; }
inline uint8_t HighNibble(uint8_t byte) { return byte >> 4; }
// A nibble whose magnitude bits are nonzero (so +0 and -0 are both "zero").
inline bool NibbleIsNonzero(uint8_t code) { return (code & 7) != 0; }

// E8M0 (UE8M0): 2^(byte-127); 0xFF is NaN.
inline constexpr uint8_t kE8M0NaN = 0xFF;
inline int E8M0Exponent(uint8_t byte) { return static_cast<int>(byte) - 127; }
inline double DecodeE8M0(uint8_t byte) {
  return byte == kE8M0NaN ? std::numeric_limits<double>::quiet_NaN()
                          : std::ldexp(1.0, E8M0Exponent(byte));
}

// E4M3FN: bias 7, no infinities, 0x7F/0xFF NaN, max 448, subnormals m * 2^-9.
inline double DecodeE4M3(uint8_t byte) {
  const int sign = byte >> 7, exp = (byte >> 3) & 0xF, man = byte & 7;
  if (exp == 0xF && man == 7) return std::numeric_limits<double>::quiet_NaN();
  double v = exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
  return sign ? -v : v;
}

// The E4M3FN byte for +2^k, exact for k in [-9, 8] (the window); -1 outside it.
inline int EncodeE4M3PowerOfTwo(int k) {
  if (k < -9 || k > 8) return -1;
  if (k <= -7) return 1 << (k + 9);  // subnormal: mantissa 1, 2 or 4
  return (k + 7) << 3;
}

inline float DecodeBF16(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even float -> BF16 (NaN stays NaN).
inline uint16_t EncodeBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_CODECS_H_
