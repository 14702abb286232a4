// The public keys a verifier accepts, read from a trust file.
//
// Format (one key per line; '#' starts a comment line; blank lines ignored):
//   ed25519 <base64 of the raw 32-byte public key> [free-text name]
// Rotation: add the new key's line and keep the old one; records signed by the old key stay
// verifiable for as long as its line stays in the file. Removing a line revokes the key.
#ifndef CKPT_CORE_EVIDENCE_TRUST_STORE_H_
#define CKPT_CORE_EVIDENCE_TRUST_STORE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"

namespace ckpt::evidence {

class TrustStore {
 public:
  // INVALID_ARGUMENT naming the file and line for a malformed entry; NOT_FOUND if absent;
  // FAILED_PRECONDITION for a file that group or others can write, or that is owned by a user
  // other than root and the caller (whoever can write it chooses which signatures verify);
  // PERMISSION_DENIED for a symbolic link (core/io/small_file.h).
  static absl::StatusOr<TrustStore> Load(const std::string& path);
  static absl::StatusOr<TrustStore> Parse(const std::string& text, const std::string& label);

  void Add(const PublicKey& key);
  // nullptr when the key id is not trusted.
  const PublicKey* Find(const std::string& keyid) const;
  // All trusted keys by key id (tlog checkpoints name keys by a different, 4-byte id).
  const std::map<std::string, PublicKey>& keys() const { return keys_; }
  bool empty() const { return keys_.empty(); }

  // The trust-file line for `key`, newline-terminated.
  static std::string Line(const PublicKey& key, const std::string& name);
  // Appends Line(key, name) to the file at `path` (creating it) unless the key is already there.
  static absl::Status AppendToFile(const std::string& path, const PublicKey& key,
                                   const std::string& name);

 private:
  std::map<std::string, PublicKey> keys_;  // by KeyId()
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_TRUST_STORE_H_
