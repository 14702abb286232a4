// The git blob object id of a file: SHA-1 over "blob <decimal length>\0" followed by the
// content. The Hugging Face hub names non-LFS files by it (its etag), so a cache blob or a
// local-dir download can be checked against it (docs/hf-layouts.md). SHA-1 is used here only
// to compare with names others chose; nothing ckpt-audit signs rests on it.
#ifndef CKPT_CORE_GIT_BLOB_SHA1_H_
#define CKPT_CORE_GIT_BLOB_SHA1_H_

#include <array>
#include <cstdint>
#include <span>

namespace ckpt {

using GitObjectId = std::array<uint8_t, 20>;

// Incremental: construct with the file's size, feed exactly that many bytes. Not thread-safe.
class GitBlobHasher {
 public:
  explicit GitBlobHasher(uint64_t size);
  ~GitBlobHasher();
  GitBlobHasher(const GitBlobHasher&) = delete;
  GitBlobHasher& operator=(const GitBlobHasher&) = delete;
  void Update(std::span<const uint8_t> bytes);
  GitObjectId Finish();

 private:
  struct EvpCtx;
  EvpCtx* ctx_;
};

GitObjectId GitBlobIdOf(std::span<const uint8_t> content);

}  // namespace ckpt

#endif  // CKPT_CORE_GIT_BLOB_SHA1_H_
