// Ed25519 keys through OpenSSL 3 EVP: the signing key of an auditor and its public key.
//
// Private keys live in PKCS#8 PEM files created with mode 0600; loading refuses a key file that
// group or others can read (FAILED_PRECONDITION), because such a key may already be copied; or on
// a PKCS#11 token (core/evidence/pkcs11_key.h), which signs through the same class. The key id
// used in DSSE signatures and trust files is hex(SHA-256(raw 32-byte public key)).
// Both classes are immutable after construction and safe to share between threads.
#ifndef CKPT_CORE_EVIDENCE_ED25519_H_
#define CKPT_CORE_EVIDENCE_ED25519_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/evidence/signer.h"

namespace ckpt::evidence {

using RawPublicKey = std::array<uint8_t, 32>;
using Signature = std::array<uint8_t, 64>;

inline std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class PublicKey {
 public:
  static absl::StatusOr<PublicKey> FromRaw(std::span<const uint8_t> raw);
  // A SubjectPublicKeyInfo PEM block ("-----BEGIN PUBLIC KEY-----").
  static absl::StatusOr<PublicKey> FromPem(const std::string& pem);

  const RawPublicKey& raw() const { return raw_; }
  std::string KeyId() const;  // hex SHA-256 of raw()
  std::string ToPem() const;
  bool Verify(std::span<const uint8_t> message, std::span<const uint8_t> signature) const;

 private:
  friend class SigningKey;
  explicit PublicKey(const RawPublicKey& raw) : raw_(raw) {}
  RawPublicKey raw_;
};

class SigningKey {
 public:
  static absl::StatusOr<SigningKey> Generate();
  // Errors: NOT_FOUND, FAILED_PRECONDITION (group/other may read it), INVALID_ARGUMENT (not an
  // Ed25519 private key PEM).
  static absl::StatusOr<SigningKey> Load(const std::string& path);
  // A key whose private half `signer` holds (a token's, core/evidence/pkcs11_key.h); `pub` is
  // its public key, which the caller has checked belongs to it.
  SigningKey(std::shared_ptr<const Signer> signer, PublicKey pub)
      : signer_(std::move(signer)), public_key_(pub) {}
  // Creates `path` with mode 0600; ALREADY_EXISTS rather than overwriting a key;
  // FAILED_PRECONDITION for a token key.
  absl::Status Save(const std::string& path) const;

  const PublicKey& public_key() const { return public_key_; }
  // Errors only from a token (its named PKCS#11 error) or a signature that is not 64 bytes.
  absl::StatusOr<Signature> Sign(std::span<const uint8_t> message) const;

 private:
  static absl::StatusOr<SigningKey> FromPkeyPem(const std::string& pem, const std::string& label);
  std::shared_ptr<const Signer> signer_;
  PublicKey public_key_;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_ED25519_H_
