#include "core/evidence/ecdsa.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/evidence/key_file.h"
#include "core/sha256.h"

namespace ckpt::evidence {

struct EcdsaPublicKey::Pkey {
  explicit Pkey(EVP_PKEY* p) : pkey(p) {}
  ~Pkey() { EVP_PKEY_free(pkey); }
  EVP_PKEY* pkey;
};

namespace {

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

// Refuses encrypted keys instead of letting OpenSSL prompt on the terminal.
int NoPassphrase(char*, int, int, void*) { return 0; }

const EVP_MD* DigestFor(EcCurve curve) {
  switch (curve) {
    case EcCurve::kP256: return EVP_sha256();
    case EcCurve::kP384: return EVP_sha384();
    case EcCurve::kP521: return EVP_sha512();
  }
  return EVP_sha256();
}

const char* GroupName(EcCurve curve) {
  switch (curve) {
    case EcCurve::kP256: return "P-256";
    case EcCurve::kP384: return "P-384";
    case EcCurve::kP521: return "P-521";
  }
  return "P-256";
}

// The curve of an EC key, or INVALID_ARGUMENT naming what the key is instead.
absl::StatusOr<EcCurve> CurveOf(EVP_PKEY* pkey, const std::string& label) {
  if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_EC) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": not an elliptic-curve key (", OBJ_nid2sn(EVP_PKEY_get_base_id(pkey)),
        "); OpenSSF model signing accepts ECDSA P-256, P-384 and P-521 keys only"));
  }
  char group[64] = {0};
  size_t len = 0;
  if (EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group,
                                     &len) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": EC key without a named curve"));
  }
  std::string name(group, len);
  if (name == "prime256v1" || name == "P-256") return EcCurve::kP256;
  if (name == "secp384r1" || name == "P-384") return EcCurve::kP384;
  if (name == "secp521r1" || name == "P-521") return EcCurve::kP521;
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": unsupported curve ", name, " (P-256, P-384, P-521 only)"));
}

}  // namespace

std::string EcCurveName(EcCurve curve) { return GroupName(curve); }

std::string EcKeyType(EcCurve curve) {
  switch (curve) {
    case EcCurve::kP256: return "ecdsa-p256";
    case EcCurve::kP384: return "ecdsa-p384";
    case EcCurve::kP521: return "ecdsa-p521";
  }
  return "ecdsa-p256";
}

absl::StatusOr<EcCurve> EcCurveFromKeyType(const std::string& type) {
  if (type == "ecdsa-p256") return EcCurve::kP256;
  if (type == "ecdsa-p384") return EcCurve::kP384;
  if (type == "ecdsa-p521") return EcCurve::kP521;
  return absl::InvalidArgumentError(absl::StrCat(
      "key type '", type, "': expected ed25519, ecdsa-p256, ecdsa-p384 or ecdsa-p521"));
}

absl::StatusOr<EcdsaPublicKey> EcdsaPublicKey::FromPem(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* pkey = PEM_read_bio_PUBKEY(bio.get(), nullptr, NoPassphrase, nullptr);
  if (pkey == nullptr) return absl::InvalidArgumentError("not a PEM public key");
  auto holder = std::make_shared<Pkey>(pkey);
  auto curve = CurveOf(pkey, "public key");
  if (!curve.ok()) return curve.status();
  return EcdsaPublicKey(std::move(holder), *curve);
}

absl::StatusOr<EcdsaPublicKey> EcdsaPublicKey::FromDer(std::span<const uint8_t> der) {
  const unsigned char* p = der.data();
  EVP_PKEY* pkey = d2i_PUBKEY(nullptr, &p, static_cast<long>(der.size()));
  if (pkey == nullptr) return absl::InvalidArgumentError("not a DER SubjectPublicKeyInfo");
  auto holder = std::make_shared<Pkey>(pkey);
  if (p != der.data() + der.size()) {
    return absl::InvalidArgumentError("trailing bytes after the DER public key");
  }
  auto curve = CurveOf(pkey, "public key");
  if (!curve.ok()) return curve.status();
  return EcdsaPublicKey(std::move(holder), *curve);
}

std::string EcdsaPublicKey::PublicPem() const {
  return PublicKeyPem(pkey_->pkey);
}

std::string EcdsaPublicKey::Hint() const {
  std::string pem = PublicPem();
  return ToHex(Sha256Of({reinterpret_cast<const uint8_t*>(pem.data()), pem.size()}));
}

bool EcdsaPublicKey::Verify(std::span<const uint8_t> message,
                            std::span<const uint8_t> der_signature) const {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx != nullptr &&
            EVP_DigestVerifyInit(ctx, nullptr, DigestFor(curve_), nullptr, pkey_->pkey) == 1 &&
            EVP_DigestVerify(ctx, der_signature.data(), der_signature.size(), message.data(),
                             message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

absl::StatusOr<EcdsaSigningKey> EcdsaSigningKey::Generate(EcCurve curve) {
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", GroupName(curve));
  if (pkey == nullptr) {
    return absl::InternalError(absl::StrCat("ECDSA ", GroupName(curve), " key generation failed"));
  }
  const std::string pem = PrivateKeyPem(pkey);
  EVP_PKEY_free(pkey);
  return FromPem(pem, "generated key");
}

absl::StatusOr<EcdsaSigningKey> EcdsaSigningKey::FromPem(const std::string& pem,
                                                         const std::string& label) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr);
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": not an unencrypted PEM private key"));
  }
  auto curve = CurveOf(pkey, label);
  if (!curve.ok()) {
    EVP_PKEY_free(pkey);
    return curve.status();
  }
  std::shared_ptr<const Signer> signer = EvpSigner(pkey, DigestFor(*curve));
  // The public half as its own key object, so it outlives nothing it does not own.
  unsigned char* der = nullptr;
  int len = i2d_PUBKEY(pkey, &der);
  if (len <= 0) return absl::InternalError(absl::StrCat(label, ": cannot encode public key"));
  auto pub = EcdsaPublicKey::FromDer({der, static_cast<size_t>(len)});
  OPENSSL_free(der);
  if (!pub.ok()) return pub.status();
  return EcdsaSigningKey(std::move(signer), *std::move(pub));
}

absl::StatusOr<EcdsaSigningKey> EcdsaSigningKey::Load(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadPrivateKeyFile(path);
  if (!pem.ok()) return pem.status();
  return FromPem(*pem, path);
}

absl::Status EcdsaSigningKey::Save(const std::string& path) const {
  absl::StatusOr<std::string> pem = signer_->PrivateKeyPem();
  if (!pem.ok()) return pem.status();
  return WritePrivateKeyFile(path, *pem);
}

absl::StatusOr<std::vector<uint8_t>> EcdsaSigningKey::Sign(
    std::span<const uint8_t> message) const {
  return signer_->Sign(message);
}

}  // namespace ckpt::evidence
