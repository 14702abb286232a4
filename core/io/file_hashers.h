// The digests ReadTree and StreamTrees take of one file (core/io/tree_image.h), fed its
// bytes front to back: the whole-file SHA-256, the git blob id when the file's layout names it
// by one (docs/hf-layouts.md), fixed-size range digests and, once the header is known, each
// tensor's SHA-256. Internal to core/io.
#ifndef CKPT_CORE_IO_FILE_HASHERS_H_
#define CKPT_CORE_IO_FILE_HASHERS_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/git_blob_sha1.h"
#include "core/io/tree_image.h"
#include "core/safetensors.h"
#include "core/sha256.h"

namespace ckpt::io_internal {

// Every digest taken of one file, fed its bytes in order.
class FileHashers {
 public:
  FileHashers(const ReadOptions& o, uint64_t size, bool git_blob_id)
      : options_(o), size_(size) {
    if (git_blob_id) git_.emplace(size);
  }

  // Tensors are known once the header is read; they tile [data_start, size).
  void SetTensors(const SafetensorsFile* f, std::vector<Digest>* out) {
    tensors_ = f;
    tensor_out_ = out;
    out->assign(f->tensors().size(), Digest{});
  }

  void Update(uint64_t offset, std::span<const uint8_t> bytes) {
    if (options_.file_digests) whole_.Update(bytes);
    if (git_) git_->Update(bytes);
    hashed_ += bytes.size();
    if (options_.range_size > 0) UpdateRanges(offset, bytes);
    if (tensors_ != nullptr) UpdateTensors(offset, bytes);
  }

  void Finish(ImageFile* f) {
    if (options_.file_digests) f->sha256 = whole_.Finish();
    if (git_ && hashed_ == size_) f->git_blob_id = git_->Finish();
    // Tensors still open here are empty ones at the end of the buffer.
    while (tensors_ != nullptr && next_ < tensors_->tensors().size()) {
      (*tensor_out_)[next_++] = tensor_.Finish();
    }
    if (options_.range_size > 0 && (range_pos_ > 0 || size_ == 0)) {
      range_digests_.push_back(range_.Finish());
    }
    f->range_digests = std::move(range_digests_);
  }

 private:
  void UpdateRanges(uint64_t offset, std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      uint64_t n = std::min<uint64_t>(bytes.size(), options_.range_size - range_pos_);
      range_.Update(bytes.first(n));
      bytes = bytes.subspan(n);
      range_pos_ += n;
      if (range_pos_ == options_.range_size) {
        range_digests_.push_back(range_.Finish());
        range_pos_ = 0;
      }
    }
  }

  void UpdateTensors(uint64_t offset, std::span<const uint8_t> bytes) {
    const std::vector<TensorInfo>& ts = tensors_->tensors();
    const uint64_t ds = tensors_->data_start();
    uint64_t pos = offset;
    while (!bytes.empty() && next_ < ts.size()) {
      const uint64_t begin = ds + ts[next_].begin, end = ds + ts[next_].end;
      if (pos < begin) {  // header bytes
        uint64_t skip = std::min<uint64_t>(bytes.size(), begin - pos);
        bytes = bytes.subspan(skip);
        pos += skip;
        continue;
      }
      uint64_t n = std::min<uint64_t>(bytes.size(), end - pos);
      tensor_.Update(bytes.first(n));
      bytes = bytes.subspan(n);
      pos += n;
      if (pos == end) {
        (*tensor_out_)[next_++] = tensor_.Finish();
        // Empty tensors that follow have the digest of no bytes.
        while (next_ < ts.size() && ts[next_].begin == ts[next_].end) {
          (*tensor_out_)[next_++] = tensor_.Finish();
        }
      }
    }
  }

  const ReadOptions& options_;
  const uint64_t size_;
  Sha256 whole_, range_, tensor_;
  std::optional<GitBlobHasher> git_;  // only for files whose hub name or etag is a git blob id
  uint64_t hashed_ = 0;
  uint64_t range_pos_ = 0;
  std::vector<Digest> range_digests_;
  const SafetensorsFile* tensors_ = nullptr;
  std::vector<Digest>* tensor_out_ = nullptr;
  size_t next_ = 0;
};

}  // namespace ckpt::io_internal

#endif  // CKPT_CORE_IO_FILE_HASHERS_H_
