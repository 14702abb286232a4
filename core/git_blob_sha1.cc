#include "core/git_blob_sha1.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <string>

namespace ckpt {

struct GitBlobHasher::EvpCtx {
  EVP_MD_CTX* md;
};

GitBlobHasher::GitBlobHasher(uint64_t size) : ctx_(new EvpCtx{EVP_MD_CTX_new()}) {
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha1(), nullptr) != 1) {
    std::abort();  // OpenSSL out of memory: nothing sensible can continue
  }
  const std::string header = "blob " + std::to_string(size);
  EVP_DigestUpdate(ctx_->md, header.data(), header.size() + 1);  // with its NUL
}

GitBlobHasher::~GitBlobHasher() {
  EVP_MD_CTX_free(ctx_->md);
  delete ctx_;
}

void GitBlobHasher::Update(std::span<const uint8_t> bytes) {
  if (!bytes.empty()) EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size());
}

GitObjectId GitBlobHasher::Finish() {
  GitObjectId id;
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, id.data(), &len);
  return id;
}

GitObjectId GitBlobIdOf(std::span<const uint8_t> content) {
  GitBlobHasher h(content.size());
  h.Update(content);
  return h.Finish();
}

}  // namespace ckpt
