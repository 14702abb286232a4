#include "core/text/name_encoding.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

constexpr char kHexDigits[] = "0123456789ABCDEF";

bool InRange(unsigned char c, unsigned char lo, unsigned char hi) { return c >= lo && c <= hi; }

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if none starts there.
size_t SequenceLength(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t left = s.size() - i;
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  if (InRange(c, 0xC2, 0xDF)) return left >= 2 && InRange(at(1), 0x80, 0xBF) ? 2 : 0;
  if (InRange(c, 0xE0, 0xEF)) {
    // E0: no overlong forms; ED: no UTF-16 surrogates (U+D800..U+DFFF).
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return left >= 3 && InRange(at(1), lo, hi) && InRange(at(2), 0x80, 0xBF) ? 3 : 0;
  }
  if (InRange(c, 0xF0, 0xF4)) {
    // F0: no overlong forms; F4: nothing above U+10FFFF.
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return left >= 4 && InRange(at(1), lo, hi) && InRange(at(2), 0x80, 0xBF) &&
                   InRange(at(3), 0x80, 0xBF)
               ? 4
               : 0;
  }
  return 0;  // a continuation byte, C0, C1 or F5..FF
}

bool NeedsEscaping(std::string_view s) {
  return s.find('\0') != std::string_view::npos || !IsValidUtf8(s);
}

void AppendEscape(unsigned char c, std::string* out) {
  *out += {'%', kHexDigits[c >> 4], kHexDigits[c & 0xF]};
}

int HexValue(char c) {  // upper-case only: EncodeName writes nothing else
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// `raw` for an error message: bytes outside valid UTF-8 sequences, and NUL, as "\xXX".
std::string ForMessage(std::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size();) {
    const size_t n = SequenceLength(raw, i);
    if (n == 0 || raw[i] == '\0') {
      const auto c = static_cast<unsigned char>(raw[i]);
      out += {'\\', 'x', kHexDigits[c >> 4], kHexDigits[c & 0xF]};
      ++i;
    } else {
      out.append(raw, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EncodeName(std::string_view raw) {
  if (!NeedsEscaping(raw)) return std::string(raw);
  std::string out;
  out.reserve(raw.size() + 16);
  for (size_t i = 0; i < raw.size();) {
    const size_t n = SequenceLength(raw, i);
    if (n == 0 || raw[i] == '\0' || raw[i] == '%') {
      AppendEscape(static_cast<unsigned char>(raw[i]), &out);
      ++i;
    } else {
      out.append(raw, i, n);
      i += n;
    }
  }
  return out;
}

absl::StatusOr<std::string> DecodeName(std::string_view encoded) {
  if (NeedsEscaping(encoded)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a recorded name: \"", EncodeName(encoded),
        "\" (shown escaped) is not valid UTF-8 or holds NUL, and no name records as that"));
  }
  std::string decoded;
  decoded.reserve(encoded.size());
  for (size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] != '%') {
      decoded.push_back(encoded[i]);
      continue;
    }
    const int hi = i + 2 < encoded.size() ? HexValue(encoded[i + 1]) : -1;
    const int lo = hi >= 0 ? HexValue(encoded[i + 2]) : -1;
    if (lo < 0) return std::string(encoded);  // a literal '%': recorded as is
    decoded.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  // Only names that need escaping are escaped, and only in one canonical way.
  if (!NeedsEscaping(decoded) || EncodeName(decoded) != encoded) return std::string(encoded);
  return decoded;
}

absl::Status CheckNoEncodingCollisions(const std::vector<std::string>& raw_names) {
  // Escaped forms are distinct for distinct raw names, and so are unescaped ones: a collision
  // is always an unescaped name equal to the escaped form of another.
  std::unordered_map<std::string, const std::string*> escaped;
  for (const std::string& raw : raw_names) {
    if (NeedsEscaping(raw)) escaped.emplace(EncodeName(raw), &raw);
  }
  if (escaped.empty()) return absl::OkStatus();
  for (const std::string& raw : raw_names) {
    auto it = escaped.find(raw);
    if (it == escaped.end()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "two names record as \"", raw, "\": the UTF-8 name \"", raw,
        "\" and the name with raw bytes \"", ForMessage(*it->second),
        "\" (\\xXX: a byte that is not UTF-8); rename one of them (docs/evidence.md, "
        "\"Name encoding\")"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
