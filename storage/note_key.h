// C2SP signed-note verifier keys ("vkeys"), the form transparency-log clients such as Go's
// golang.org/x/mod/sumdb/note take a log's public key in:
//
//   <name>+<key hash: 8 lowercase hex digits>+<base64(0x01 || 32-byte Ed25519 public key)>
//
// where the key hash is the first four bytes of SHA-256(name || "\n" || 0x01 || key), read
// big-endian (storage/tlog_checkpoint.h NoteKeyId), and the name is the log's origin.
#ifndef CKPT_STORAGE_NOTE_KEY_H_
#define CKPT_STORAGE_NOTE_KEY_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"

namespace ckpt::storage {

struct NoteVerifierKey {
  std::string name;
  evidence::PublicKey key;
};

// INVALID_ARGUMENT for a name a signed note cannot carry (empty, '+', whitespace, not UTF-8).
absl::StatusOr<std::string> FormatNoteVerifierKey(const std::string& name,
                                                  const evidence::PublicKey& key);

// INVALID_ARGUMENT for a malformed vkey, a key type other than Ed25519 (0x01), or a key hash that
// does not match the name and key.
absl::StatusOr<NoteVerifierKey> ParseNoteVerifierKey(const std::string& vkey);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_NOTE_KEY_H_
