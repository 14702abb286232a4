// The text form of digests in statements: SHA-256 as 64 lower-case hex characters, and the
// value of one hex digit.
#ifndef CKPT_CORE_EVIDENCE_HEX_DIGEST_H_
#define CKPT_CORE_EVIDENCE_HEX_DIGEST_H_

#include <string_view>

namespace ckpt::evidence {

// True for exactly 64 lower-case hex characters (what ToHex of a SHA-256 gives).
inline bool IsSha256Hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The value of one hex digit, either case; -1 for any other character.
inline int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_HEX_DIGEST_H_
