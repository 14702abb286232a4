// ECDSA keys on NIST P-256, P-384 and P-521 through OpenSSL 3 EVP: the keys OpenSSF model
// signing accepts for `sign key` / `verify key` (docs/interop.md).
//
// A signature is DER (SEQUENCE {r, s}) over the message hashed with SHA-256, SHA-384 or SHA-512
// as the curve size dictates. The key hint a Sigstore bundle carries is the lowercase hex SHA-256
// of the public key's SubjectPublicKeyInfo PEM text (PublicPem()). Private keys follow the same
// file rules as the Ed25519 evidence key (core/evidence/ed25519.h): created 0600, refused when
// group or others may read them, never prompted for a passphrase. A P-256 key may instead live on
// a PKCS#11 token (core/evidence/pkcs11_key.h) and signs through the same class.
// Both classes are immutable after construction and safe to share between threads.
#ifndef CKPT_CORE_EVIDENCE_ECDSA_H_
#define CKPT_CORE_EVIDENCE_ECDSA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/evidence/signer.h"

namespace ckpt::evidence {

enum class EcCurve { kP256, kP384, kP521 };

std::string EcCurveName(EcCurve curve);  // "P-256", "P-384", "P-521"
// "ecdsa-p256", "ecdsa-p384", "ecdsa-p521" (the `keys generate --type` values) and back.
absl::StatusOr<EcCurve> EcCurveFromKeyType(const std::string& type);
std::string EcKeyType(EcCurve curve);

class EcdsaPublicKey {
 public:
  // A SubjectPublicKeyInfo PEM block; text before the block (as certtool writes) is skipped.
  // INVALID_ARGUMENT for anything but an EC key on one of the three curves.
  static absl::StatusOr<EcdsaPublicKey> FromPem(const std::string& pem);
  // DER SubjectPublicKeyInfo.
  static absl::StatusOr<EcdsaPublicKey> FromDer(std::span<const uint8_t> der);

  EcCurve curve() const { return curve_; }
  std::string PublicPem() const;
  // Hex SHA-256 of PublicPem(): model_signing's verificationMaterial.publicKey.hint.
  std::string Hint() const;
  bool Verify(std::span<const uint8_t> message, std::span<const uint8_t> der_signature) const;

 private:
  friend class EcdsaSigningKey;
  struct Pkey;
  EcdsaPublicKey(std::shared_ptr<Pkey> pkey, EcCurve curve) : pkey_(std::move(pkey)), curve_(curve) {}
  std::shared_ptr<Pkey> pkey_;
  EcCurve curve_;
};

class EcdsaSigningKey {
 public:
  static absl::StatusOr<EcdsaSigningKey> Generate(EcCurve curve);
  // SEC1 ("EC PRIVATE KEY") or PKCS#8 PEM. Errors: NOT_FOUND, FAILED_PRECONDITION (group/other
  // may read it), INVALID_ARGUMENT (not an unencrypted EC key on a supported curve).
  static absl::StatusOr<EcdsaSigningKey> Load(const std::string& path);
  // A key whose private half `signer` holds (a token's, core/evidence/pkcs11_key.h); `pub` is
  // its public key, which the caller has checked belongs to it.
  EcdsaSigningKey(std::shared_ptr<const Signer> signer, EcdsaPublicKey pub)
      : signer_(std::move(signer)), public_key_(std::move(pub)) {}
  // PKCS#8 PEM created with mode 0600; ALREADY_EXISTS rather than overwriting a key;
  // FAILED_PRECONDITION for a token key.
  absl::Status Save(const std::string& path) const;

  const EcdsaPublicKey& public_key() const { return public_key_; }
  // DER signature; INTERNAL if OpenSSL fails, a token's named PKCS#11 error.
  absl::StatusOr<std::vector<uint8_t>> Sign(std::span<const uint8_t> message) const;

 private:
  static absl::StatusOr<EcdsaSigningKey> FromPem(const std::string& pem, const std::string& label);
  std::shared_ptr<const Signer> signer_;
  EcdsaPublicKey public_key_;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_ECDSA_H_
