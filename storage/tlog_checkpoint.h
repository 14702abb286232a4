// Signed tree heads in the C2SP tlog-checkpoint / signed-note format.
//
//   <origin>\n<tree size>\n<base64 root hash>\n\n— <key name> <base64(key id || signature)>\n
//
// The Ed25519 signature covers the body (the first three lines, newline-terminated); the key
// name is the log's origin and the 4-byte key id is SHA-256(name || 0x0A || 0x01 || pubkey)[:4].
#ifndef CKPT_STORAGE_TLOG_CHECKPOINT_H_
#define CKPT_STORAGE_TLOG_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"
#include "storage/merkle.h"

namespace ckpt::storage {

struct TreeHead {
  std::string origin;
  uint64_t size = 0;
  Hash root{};
};

std::array<uint8_t, 4> NoteKeyId(const std::string& name, const evidence::PublicKey& key);

// The signed note text for `head`, signed by `key` under the name head.origin. Errors only from
// a token key.
absl::StatusOr<std::string> SignCheckpoint(const TreeHead& head, const evidence::SigningKey& key);

// The body of a signed note (origin, size, root), its signatures not checked: for a note this
// process stored itself (storage/head_state.h). INVALID_ARGUMENT when the text is malformed.
absl::StatusOr<TreeHead> ParseCheckpoint(const std::string& note);

// Parses a signed note and checks that one of its signature lines is a valid signature by a key
// in `trust` under `origin`. FAILED_PRECONDITION when none verifies, INVALID_ARGUMENT when the
// text is malformed, both naming the origin and size.
absl::StatusOr<TreeHead> VerifyCheckpoint(const std::string& note, const std::string& origin,
                                          const evidence::TrustStore& trust);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_TLOG_CHECKPOINT_H_
