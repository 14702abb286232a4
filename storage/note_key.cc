#include "storage/note_key.h"

#include <cstdio>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/evidence/base64.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::storage {
namespace {

constexpr uint8_t kEd25519Type = 0x01;

// Printable, non-empty, no '+' and no whitespace: what a signature line's name may be. Bytes
// >= 0x80 are allowed only as well-formed UTF-8.
bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size();) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x80) {
      if (c <= 0x20 || c == 0x7F || c == '+') return false;
      ++i;
      continue;
    }
    int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || i + len > name.size()) return false;
    for (int k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(name[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

std::string KeyHashHex(const std::string& name, const evidence::PublicKey& key) {
  std::array<uint8_t, 4> id = NoteKeyId(name, key);
  return absl::StrFormat("%02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
}

}  // namespace

absl::StatusOr<std::string> FormatNoteVerifierKey(const std::string& name,
                                                  const evidence::PublicKey& key) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' cannot name a signed-note key (empty, '+' or whitespace)"));
  }
  std::vector<uint8_t> blob{kEd25519Type};
  blob.insert(blob.end(), key.raw().begin(), key.raw().end());
  return absl::StrCat(name, "+", KeyHashHex(name, key), "+", evidence::Base64Encode(blob));
}

absl::StatusOr<NoteVerifierKey> ParseNoteVerifierKey(const std::string& vkey) {
  std::vector<std::string> parts = absl::StrSplit(vkey, absl::MaxSplits('+', 2));
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("verifier key '", vkey, "': ", why));
  };
  // The name and hash hold no '+'; the base64 key may.
  if (parts.size() != 3) return bad("expected NAME+HASH+KEY");
  if (!ValidName(parts[0])) return bad("invalid name");
  uint32_t hash = 0;
  if (parts[1].size() != 8 || !absl::SimpleHexAtoi(parts[1], &hash)) {
    return bad("key hash is not 8 hex digits");
  }
  auto blob = evidence::Base64Decode(parts[2]);
  if (!blob.ok()) return bad(std::string(blob.status().message()));
  if (blob->size() != 33 || (*blob)[0] != kEd25519Type) {
    return bad("not an Ed25519 key (type byte 0x01 and 32 key bytes)");
  }
  auto key = evidence::PublicKey::FromRaw(std::span<const uint8_t>(blob->data() + 1, 32));
  if (!key.ok()) return bad(std::string(key.status().message()));
  std::array<uint8_t, 4> id = NoteKeyId(parts[0], *key);
  uint32_t want = static_cast<uint32_t>(id[0]) << 24 | static_cast<uint32_t>(id[1]) << 16 |
                  static_cast<uint32_t>(id[2]) << 8 | id[3];
  if (hash != want) return bad("key hash does not match the name and key");
  return NoteVerifierKey{parts[0], *key};
}

}  // namespace ckpt::storage
