#include "core/evidence/ed25519.h"

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/evidence/key_file.h"
#include "core/sha256.h"

namespace ckpt::evidence {
namespace {

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

}  // namespace

absl::StatusOr<PublicKey> PublicKey::FromRaw(std::span<const uint8_t> raw) {
  if (raw.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("Ed25519 public key must be 32 bytes, got ", raw.size()));
  }
  RawPublicKey k;
  std::memcpy(k.data(), raw.data(), 32);
  return PublicKey(k);
}

absl::StatusOr<PublicKey> PublicKey::FromPem(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* pkey = PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr);
  if (pkey == nullptr) return absl::InvalidArgumentError("not a PEM public key");
  RawPublicKey raw;
  size_t len = raw.size();
  bool ok = EVP_PKEY_get_base_id(pkey) == EVP_PKEY_ED25519 &&
            EVP_PKEY_get_raw_public_key(pkey, raw.data(), &len) == 1 && len == 32;
  EVP_PKEY_free(pkey);
  if (!ok) return absl::InvalidArgumentError("PEM public key is not Ed25519");
  return PublicKey(raw);
}

std::string PublicKey::KeyId() const { return ToHex(Sha256Of(raw_)); }

std::string PublicKey::ToPem() const {
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw_.data(), 32);
  std::string pem = PublicKeyPem(pkey);
  EVP_PKEY_free(pkey);
  return pem;
}

bool PublicKey::Verify(std::span<const uint8_t> message,
                       std::span<const uint8_t> signature) const {
  if (signature.size() != 64) return false;
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw_.data(), 32);
  if (pkey == nullptr) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
            EVP_DigestVerify(ctx, signature.data(), signature.size(), message.data(),
                             message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pkey);
  return ok;
}

absl::StatusOr<SigningKey> SigningKey::Generate() {
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (pkey == nullptr) return absl::InternalError("Ed25519 key generation failed");
  const std::string pem = PrivateKeyPem(pkey);
  EVP_PKEY_free(pkey);
  return FromPkeyPem(pem, "generated key");
}

absl::StatusOr<SigningKey> SigningKey::FromPkeyPem(const std::string& pem,
                                                   const std::string& label) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a PEM private key"));
  }
  std::shared_ptr<const Signer> signer = EvpSigner(pkey, nullptr);
  RawPublicKey raw;
  size_t len = raw.size();
  if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519 ||
      EVP_PKEY_get_raw_public_key(pkey, raw.data(), &len) != 1 || len != 32) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not an Ed25519 private key"));
  }
  return SigningKey(std::move(signer), PublicKey(raw));
}

absl::StatusOr<SigningKey> SigningKey::Load(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadPrivateKeyFile(path);
  if (!pem.ok()) return pem.status();
  return FromPkeyPem(*pem, path);
}

absl::Status SigningKey::Save(const std::string& path) const {
  absl::StatusOr<std::string> pem = signer_->PrivateKeyPem();
  if (!pem.ok()) return pem.status();
  return WritePrivateKeyFile(path, *pem);
}

absl::StatusOr<Signature> SigningKey::Sign(std::span<const uint8_t> message) const {
  absl::StatusOr<std::vector<uint8_t>> sig = signer_->Sign(message);
  if (!sig.ok()) return sig.status();
  Signature out;
  if (sig->size() != out.size()) {
    return absl::DataLossError(
        absl::StrCat("Ed25519 signer returned ", sig->size(), " bytes, not 64"));
  }
  std::memcpy(out.data(), sig->data(), out.size());
  return out;
}

}  // namespace ckpt::evidence
