// Where a signing key lives, as the CLI's and the daemon's flags name it: `--key` is a PEM file's
// path or a pkcs11: URI (core/evidence/pkcs11_uri.h); a URI needs `--pkcs11-module PATH` and
// the PIN from exactly one of `--pin-file PATH` and `--pin-env NAME`, never argv
// (docs/evidence.md, "Keys in an HSM"). The one way every command opens its signing key.
#ifndef CKPT_CORE_EVIDENCE_KEY_SOURCE_H_
#define CKPT_CORE_EVIDENCE_KEY_SOURCE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/pkcs11_key.h"

namespace ckpt::evidence {

struct KeySource {
  std::string key;  // a PEM file's path, or a pkcs11: URI
  std::string pkcs11_module;
  std::string pin_file;
  std::string pin_env;
};

// The module and PIN of a pkcs11: key. The PIN file is read as a secret (a regular file of at
// most 1 KiB that group and others cannot access; one trailing newline is dropped); the
// variable must be set and non-empty. INVALID_ARGUMENT without a module, or with both or
// neither PIN source.
absl::StatusOr<Pkcs11Access> Pkcs11AccessOf(const KeySource& source);

// The Ed25519 evidence key or the ECDSA model-signing key `source` names (PEM: any curve the
// file holds; token: P-256). INVALID_ARGUMENT for PKCS#11 flags beside a PEM key; otherwise the
// errors of SigningKey::Load / EcdsaSigningKey::Load or of core/evidence/pkcs11_key.h.
absl::StatusOr<SigningKey> LoadSigningKey(const KeySource& source);
absl::StatusOr<EcdsaSigningKey> LoadEcdsaSigningKey(const KeySource& source);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_KEY_SOURCE_H_
