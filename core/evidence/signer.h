// What signs: the private half of a key wherever it lives. A key read from a PEM file is held in
// memory by OpenSSL (EvpSigner below); a key on a PKCS#11 token stays there and the token signs
// (core/evidence/pkcs11_key.h). SigningKey (Ed25519, core/evidence/ed25519.h) and
// EcdsaSigningKey (core/evidence/ecdsa.h) each hold one, so every signing path takes either kind
// of key the same way (docs/evidence.md, "Keys in an HSM").
// Implementations are immutable after construction and safe to share between threads.
#ifndef CKPT_CORE_EVIDENCE_SIGNER_H_
#define CKPT_CORE_EVIDENCE_SIGNER_H_

#include <openssl/evp.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::evidence {

class Signer {
 public:
  virtual ~Signer() = default;
  // The signature of `message` as verifiers read it: Ed25519's 64 bytes, or ECDSA's DER
  // SEQUENCE {r, s} over the SHA-2 digest of `message` the curve calls for.
  virtual absl::StatusOr<std::vector<uint8_t>> Sign(std::span<const uint8_t> message) const = 0;
  // The PKCS#8 PEM of the private key, to write a generated key to its file. A token key never
  // leaves its token: FAILED_PRECONDITION.
  virtual absl::StatusOr<std::string> PrivateKeyPem() const = 0;
};

// A signer over an OpenSSL private key, which it owns from here on; `digest` is null for
// Ed25519 (which hashes internally) and the curve's SHA-2 for ECDSA.
std::shared_ptr<const Signer> EvpSigner(EVP_PKEY* pkey, const EVP_MD* digest);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_SIGNER_H_
