#include "core/evidence/signer.h"

#include "core/evidence/key_file.h"

namespace ckpt::evidence {
namespace {

class OpenSslSigner final : public Signer {
 public:
  OpenSslSigner(EVP_PKEY* pkey, const EVP_MD* digest) : pkey_(pkey), digest_(digest) {}
  ~OpenSslSigner() override { EVP_PKEY_free(pkey_); }
  OpenSslSigner(const OpenSslSigner&) = delete;
  OpenSslSigner& operator=(const OpenSslSigner&) = delete;

  absl::StatusOr<std::vector<uint8_t>> Sign(std::span<const uint8_t> message) const override {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    size_t len = 0;
    std::vector<uint8_t> sig;
    bool ok = ctx != nullptr && EVP_DigestSignInit(ctx, nullptr, digest_, nullptr, pkey_) == 1 &&
              EVP_DigestSign(ctx, nullptr, &len, message.data(), message.size()) == 1;
    if (ok) {
      sig.resize(len);
      ok = EVP_DigestSign(ctx, sig.data(), &len, message.data(), message.size()) == 1;
      sig.resize(len);
    }
    EVP_MD_CTX_free(ctx);
    if (!ok) return absl::InternalError("OpenSSL signing failed");
    return sig;
  }

  absl::StatusOr<std::string> PrivateKeyPem() const override {
    return evidence::PrivateKeyPem(pkey_);
  }

 private:
  EVP_PKEY* const pkey_;
  const EVP_MD* const digest_;
};

}  // namespace

std::shared_ptr<const Signer> EvpSigner(EVP_PKEY* pkey, const EVP_MD* digest) {
  return std::make_shared<OpenSslSigner>(pkey, digest);
}

}  // namespace ckpt::evidence
