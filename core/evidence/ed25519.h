// Ed25519 keys through OpenSSL 3 EVP: the signing key of an auditor and its public key.
//
// Private keys live in PKCS#8 PEM files created with mode 0600; loading refuses a key file that
// group or others can read (FAILED_PRECONDITION), because such a key may already be copied. The
// key id used in DSSE signatures and trust files is hex(SHA-256(raw 32-byte public key)).
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
  // Creates `path` with mode 0600; ALREADY_EXISTS rather than overwriting a key.
  absl::Status Save(const std::string& path) const;

  const PublicKey& public_key() const { return public_key_; }
  Signature Sign(std::span<const uint8_t> message) const;

 private:
  struct Pkey;
  SigningKey(std::shared_ptr<Pkey> pkey, PublicKey pub)
      : pkey_(std::move(pkey)), public_key_(pub) {}
  static absl::StatusOr<SigningKey> FromPkeyPem(const std::string& pem, const std::string& label);
  std::shared_ptr<Pkey> pkey_;
  PublicKey public_key_;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_ED25519_H_
