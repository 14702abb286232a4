// Read-only memory-mapped files, the one way ckpt-audit reads checkpoint bytes.
//
// A MappedFile maps a whole regular file and remembers its identity (device, inode, size,
// mtime). `CheckUnchanged()` re-stats the path after work is done so that a file replaced or
// modified during an audit is reported instead of silently producing evidence about bytes that
// are no longer on disk. Thread-safe: all members are constant after Open.
#ifndef CKPT_CORE_MAPPED_FILE_H_
#define CKPT_CORE_MAPPED_FILE_H_

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

class MappedFile {
 public:
  // Maps `path`. Errors: NOT_FOUND, INVALID_ARGUMENT for a non-regular file, DATA_LOSS for I/O.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  uint64_t size() const { return size_; }

  // DATA_LOSS if the file at path() is no longer the file that was mapped, or its size or
  // modification time changed since Open.
  absl::Status CheckUnchanged() const;

  // Hints the kernel that [offset, offset+len) will be read soon, sequentially.
  void WillNeed(uint64_t offset, uint64_t len) const;

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size, const struct stat& st);
  const std::string path_;
  const uint8_t* const data_;
  const uint64_t size_;
  const struct stat stat_;
};

}  // namespace ckpt

#endif  // CKPT_CORE_MAPPED_FILE_H_
