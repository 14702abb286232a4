// Row-at-a-time scans over packed FP4 groups and scale bytes, the hot loops of the
// scale-window policy and the pair verifier. SSE2 (every x86-64) where available, else scalar;
// both give identical answers. Internal to core/quant.
#ifndef CKPT_CORE_QUANT_BYTE_SCAN_H_
#define CKPT_CORE_QUANT_BYTE_SCAN_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckpt::quant {

// Any nonzero magnitude in the 16 packed bytes (32 codes) at p.
inline bool GroupActive16(const uint8_t* p) {
  uint64_t a, b;
  std::memcpy(&a, p, 8);
  std::memcpy(&b, p + 8, 8);
  return ((a | b) & 0x7777777777777777ull) != 0;
}

inline bool Same16(const uint8_t* a, const uint8_t* b) {
  uint64_t a0, a1, b0, b1;
  std::memcpy(&a0, a, 8);
  std::memcpy(&a1, a + 8, 8);
  std::memcpy(&b0, b, 8);
  std::memcpy(&b1, b + 8, 8);
  return ((a0 ^ b0) | (a1 ^ b1)) == 0;
}

#if defined(__SSE2__)
// True when every 32-code group (16 packed bytes) of the row has a nonzero magnitude:
// pmovmskb of "byte & 0x77 == 0" is 0xFFFF only for an all-zero group; +1 carries into bit 16.
inline bool RowAllActive(const uint8_t* row, uint64_t groups) {
  const __m128i mask = _mm_set1_epi8(0x77), zero = _mm_setzero_si128();
  uint32_t carry = 0;
  for (uint64_t g = 0; g < groups; ++g) {
    const __m128i v = _mm_and_si128(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * g)), mask);
    carry |= static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero))) + 1;
  }
  return (carry & 0x10000) == 0;
}

inline void MinMaxBytes(const uint8_t* p, uint64_t n, uint8_t* lo, uint8_t* hi) {
  __m128i vlo = _mm_set1_epi8(static_cast<char>(0xFF)), vhi = _mm_setzero_si128();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    vlo = _mm_min_epu8(vlo, v);
    vhi = _mm_max_epu8(vhi, v);
  }
  // Horizontal reduction by halving (the shift must be an immediate).
  vlo = _mm_min_epu8(vlo, _mm_srli_si128(vlo, 8)), vhi = _mm_max_epu8(vhi, _mm_srli_si128(vhi, 8));
  vlo = _mm_min_epu8(vlo, _mm_srli_si128(vlo, 4)), vhi = _mm_max_epu8(vhi, _mm_srli_si128(vhi, 4));
  vlo = _mm_min_epu8(vlo, _mm_srli_si128(vlo, 2)), vhi = _mm_max_epu8(vhi, _mm_srli_si128(vhi, 2));
  vlo = _mm_min_epu8(vlo, _mm_srli_si128(vlo, 1)), vhi = _mm_max_epu8(vhi, _mm_srli_si128(vhi, 1));
  *lo = static_cast<uint8_t>(_mm_cvtsi128_si32(vlo));
  *hi = static_cast<uint8_t>(_mm_cvtsi128_si32(vhi));
  for (; i < n; ++i) *lo = std::min(*lo, p[i]), *hi = std::max(*hi, p[i]);
}
#else
inline bool RowAllActive(const uint8_t* row, uint64_t groups) {
  for (uint64_t g = 0; g < groups; ++g) {
    if (!GroupActive16(row + 16 * g)) return false;
  }
  return true;
}

inline void MinMaxBytes(const uint8_t* p, uint64_t n, uint8_t* lo, uint8_t* hi) {
  *lo = 255, *hi = 0;
  for (uint64_t i = 0; i < n; ++i) *lo = std::min(*lo, p[i]), *hi = std::max(*hi, p[i]);
}
#endif

// True when, for every group g, both derived E4M3 block-scale bytes equal ((s_g + c) << 3), the
// normal E4M3 encoding of 2^(s_g - 127 + j) for c = j - 120. Callers ensure s_g + c is in
// [1, 15] for the whole row (a normal, exactly representable power of two).
inline bool RowScalesMatchNormal(const uint8_t* s, const uint8_t* d, uint64_t groups, int c) {
  uint64_t g = 0;
#if defined(__SSE2__)
  const __m128i add = _mm_set1_epi8(static_cast<char>(c)), keep = _mm_set1_epi8(static_cast<char>(0xF8));
  uint32_t bad = 0;
  for (; g + 16 <= groups; g += 16) {
    __m128i e = _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + g)), add);
    e = _mm_and_si128(_mm_slli_epi16(e, 3), keep);
    const __m128i d0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 2 * g));
    const __m128i d1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + 2 * g + 16));
    bad |= static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_unpacklo_epi8(e, e), d0)) &
                                 _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_unpackhi_epi8(e, e), d1))) ^
           0xFFFFu;
  }
  if (bad) return false;
#endif
  for (; g < groups; ++g) {
    const uint8_t want = static_cast<uint8_t>((s[g] + c) << 3);
    if (d[2 * g] != want || d[2 * g + 1] != want) return false;
  }
  return true;
}

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_BYTE_SCAN_H_
