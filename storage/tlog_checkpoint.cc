#include "storage/tlog_checkpoint.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/base64.h"

namespace ckpt::storage {
namespace {

// U+2014 EM DASH, which starts every signature line of a signed note.
constexpr char kEmDash[] = "\xE2\x80\x94";

std::string Body(const TreeHead& head) {
  return absl::StrCat(head.origin, "\n", head.size, "\n", evidence::Base64Encode(head.root),
                      "\n");
}

}  // namespace

std::array<uint8_t, 4> NoteKeyId(const std::string& name, const evidence::PublicKey& key) {
  Sha256 h;
  h.Update(evidence::AsBytes(name));
  const uint8_t sep[2] = {0x0A, 0x01};  // newline, then the Ed25519 signature-type byte
  h.Update(sep);
  h.Update(key.raw());
  Digest d = h.Finish();
  return {d[0], d[1], d[2], d[3]};
}

absl::StatusOr<std::string> SignCheckpoint(const TreeHead& head,
                                           const evidence::SigningKey& key) {
  std::string body = Body(head);
  absl::StatusOr<evidence::Signature> sig = key.Sign(evidence::AsBytes(body));
  if (!sig.ok()) return sig.status();
  std::array<uint8_t, 4> id = NoteKeyId(head.origin, key.public_key());
  std::vector<uint8_t> blob(id.begin(), id.end());
  blob.insert(blob.end(), sig->begin(), sig->end());
  return absl::StrCat(body, "\n", kEmDash, " ", head.origin, " ", evidence::Base64Encode(blob),
                      "\n");
}

absl::StatusOr<TreeHead> ParseCheckpoint(const std::string& note) {
  size_t split = note.find("\n\n");
  if (split == std::string::npos) {
    return absl::InvalidArgumentError("checkpoint: no blank line between body and signatures");
  }
  std::vector<std::string> lines = absl::StrSplit(note.substr(0, split + 1), '\n');
  // body ends with '\n', so the split yields a trailing empty string.
  TreeHead head;
  if (lines.size() < 4 || !absl::SimpleAtoi(lines[1], &head.size)) {
    return absl::InvalidArgumentError("checkpoint: body is not origin, size, root");
  }
  head.origin = lines[0];
  auto root = evidence::Base64Decode(lines[2]);
  if (!root.ok() || root->size() != head.root.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", head.origin, "@", head.size, ": root is not a base64 hash"));
  }
  std::memcpy(head.root.data(), root->data(), head.root.size());
  return head;
}

absl::StatusOr<TreeHead> VerifyCheckpoint(const std::string& note, const std::string& origin,
                                          const evidence::TrustStore& trust) {
  auto head = ParseCheckpoint(note);
  if (!head.ok()) return head.status();
  if (head->origin != origin) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint origin '", head->origin, "' is not this log's '", origin, "'"));
  }
  const size_t split = note.find("\n\n");
  const std::string body = note.substr(0, split + 1);
  std::string sigs = note.substr(split + 2);
  std::string prefix = absl::StrCat(kEmDash, " ", origin, " ");
  for (absl::string_view line : absl::StrSplit(sigs, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, prefix)) continue;
    auto blob = evidence::Base64Decode(std::string(line.substr(prefix.size())));
    if (!blob.ok() || blob->size() != 4 + 64) continue;
    for (const auto& [keyid, key] : trust.keys()) {
      std::array<uint8_t, 4> id = NoteKeyId(origin, key);
      if (std::memcmp(id.data(), blob->data(), 4) != 0) continue;
      if (key.Verify(evidence::AsBytes(body), std::span<const uint8_t>(blob->data() + 4, 64))) {
        return head;
      }
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint ", origin, "@", head->size, ": no signature by a trusted key verifies"));
}

}  // namespace ckpt::storage
