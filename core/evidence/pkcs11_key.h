// Signing keys on a PKCS#11 token (docs/evidence.md, "Keys in an HSM"): the module named by
// --pkcs11-module (an absolute path to a regular file that only its owner, root or this user,
// can write) is loaded with dlopen and reached through C_GetFunctionList only; the key is
// the private key object an RFC 7512 URI names (core/evidence/pkcs11_uri.h), and the token signs
// with it: Ed25519 evidence keys with CKM_EDDSA, ECDSA P-256 model-signing keys with CKM_ECDSA
// over the SHA-256 digest (the token's r||s is rewritten as the DER verifiers read). Every
// signature the token returns is verified with the key's public half before it is used: one
// that does not verify is DATA_LOSS, never returned.
//
// The private key never leaves the token: a key object that is extractable (CKA_EXTRACTABLE
// true) or not sensitive (CKA_SENSITIVE false) is refused (FAILED_PRECONDITION), and generated
// keys are created sensitive, non-extractable and persistent. The PIN is tried once: a wrong
// PIN is PERMISSION_DENIED and never retried, so one mistake costs the token one attempt. Every
// PKCS#11 return code other than CKR_OK becomes a status naming the call and the CKR_ code.
#ifndef CKPT_CORE_EVIDENCE_PKCS11_KEY_H_
#define CKPT_CORE_EVIDENCE_PKCS11_KEY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/pkcs11_uri.h"

namespace ckpt::evidence {

enum class Pkcs11KeyType { kEd25519, kEcdsaP256 };

// How to reach a token: the module's path and the user PIN (read from a file or the
// environment by the caller, never from argv).
struct Pkcs11Access {
  std::string module;
  std::string pin;
};

// The Ed25519 (CKK_EC_EDWARDS) or ECDSA P-256 (CKK_EC) private key `uri` names, with the public
// key object beside it (same CKA_ID, else same label), checked to belong to it by signing and
// verifying a probe. Errors: NOT_FOUND (no such token or object, naming what was searched),
// INVALID_ARGUMENT (several match), FAILED_PRECONDITION (extractable, not sensitive, wrong key
// type or curve, no CKA_SIGN, public key missing or not its pair), PERMISSION_DENIED (wrong PIN),
// and the named PKCS#11 error of any failing call.
absl::StatusOr<SigningKey> OpenPkcs11Ed25519Key(const Pkcs11Uri& uri, const Pkcs11Access& access);
absl::StatusOr<EcdsaSigningKey> OpenPkcs11EcdsaKey(const Pkcs11Uri& uri,
                                                   const Pkcs11Access& access);

// Creates a key pair of `type` on the token `uri` names, labelled uri.object (required) and with
// CKA_ID uri.id when given: the private key CKA_TOKEN, CKA_PRIVATE, CKA_SENSITIVE, CKA_SIGN true
// and CKA_EXTRACTABLE false. ALREADY_EXISTS when an object with that label or id is there (a key
// is never shadowed or replaced). Open the key afterwards with the functions above.
absl::Status GeneratePkcs11Key(const Pkcs11Uri& uri, Pkcs11KeyType type,
                               const Pkcs11Access& access);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_PKCS11_KEY_H_
