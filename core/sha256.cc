#include "core/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>

namespace ckpt {

struct Sha256::EvpCtx {
  EVP_MD_CTX* md;
};

Sha256::Sha256() : ctx_(new EvpCtx{EVP_MD_CTX_new()}) {
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) {
    std::abort();  // OpenSSL out of memory: nothing sensible can continue
  }
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_->md);
  delete ctx_;
}

void Sha256::Update(std::span<const uint8_t> bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size());
}

Digest Sha256::Finish() {
  Digest d;
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, d.data(), &len);
  EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr);
  return d;
}

Digest Sha256Of(std::span<const uint8_t> bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.Finish();
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace ckpt
