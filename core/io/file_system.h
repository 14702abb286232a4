// The one file-system interface every audit read goes through (docs/audit-engine.md).
//
// A checkpoint root is opened once as a directory descriptor; everything under it is opened
// relative to that descriptor with openat and O_NOFOLLOW, so a path component swapped for a
// symlink after the root was checked is refused instead of followed, and a file renamed over
// after it was opened does not change what is read. Files are read with pread into memory the
// caller owns (never mapped: a mapping of a file that another process truncates raises SIGBUS).
//
// Tests wrap RealFileSystem() to change, truncate or rename files between any two reads.
// Thread-safety: a Directory and a RandomAccessFile may be used from several threads at once.
#ifndef CKPT_CORE_IO_FILE_SYSTEM_H_
#define CKPT_CORE_IO_FILE_SYSTEM_H_

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::io {

// What identifies a file's content without reading it. ctime cannot be set by a user and moves
// on every write, truncate, rename and utimes call, so a file whose identity is unchanged
// across a read was not modified through the file system during it.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
  static FileIdentity Of(const struct stat& st);
};

enum class EntryType { kRegular, kDirectory, kSymlink, kOther };

struct DirEntry {
  std::string name;  // raw bytes as the file system returned them
  EntryType type = EntryType::kOther;
};

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to out.size() bytes at `offset`; fewer only at end of file. DATA_LOSS on I/O errors.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, std::span<uint8_t> out) const = 0;
  // fstat of the open descriptor.
  virtual absl::StatusOr<FileIdentity> Identity() const = 0;
  // Tells the kernel the range is consumed and may leave the page cache.
  virtual void Consumed(uint64_t offset, uint64_t length) const = 0;
};

class Directory {
 public:
  virtual ~Directory() = default;
  // `name` is one path component (no '/'). Symlinks are never followed: PERMISSION_DENIED
  // naming the link. NOT_FOUND when absent; INVALID_ARGUMENT for a non-regular file.
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(const std::string& name) const = 0;
  virtual absl::StatusOr<std::unique_ptr<Directory>> OpenDirectory(const std::string& name) const = 0;
  // Entries other than "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<DirEntry>> List() const = 0;
  // fstatat without following a symlink: the identity the name points to now.
  virtual absl::StatusOr<FileIdentity> StatAt(const std::string& name) const = 0;
  // fstat of the directory itself.
  virtual absl::StatusOr<FileIdentity> Identity() const = 0;
  // The text of the symbolic link `name` (readlinkat), never followed. INVALID_ARGUMENT when
  // `name` is not a link. Links are resolved only under rules (core/io/confined_links.h).
  virtual absl::StatusOr<std::string> ReadLink(const std::string& name) const = 0;
  // The directory this one is in: openat(".."), the real parent whatever path led here,
  // labelled with its real path (INVALID_ARGUMENT when that cannot be established).
  virtual absl::StatusOr<std::unique_ptr<Directory>> OpenParent() const = 0;
  // For messages and records: where the directory is (a root: its real path when opened).
  virtual const std::string& label() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Opens `path` (absolute or relative to the working directory; symlinks in it are resolved
  // here, once) as a directory, labelled with its real path. NOT_FOUND when it is not a
  // directory; INVALID_ARGUMENT naming `path` when its real path cannot be established (for
  // one longer than PATH_MAX): a directory is never labelled with the path given.
  virtual absl::StatusOr<std::unique_ptr<Directory>> OpenRoot(const std::string& path) const = 0;
};

// The process's real file system (POSIX openat/pread/fstatat).
const FileSystem& RealFileSystem();

// Splits a relative POSIX path into components; INVALID_ARGUMENT for "", absolute paths, "."
// or ".." components and empty components.
absl::StatusOr<std::vector<std::string>> PathComponents(const std::string& relative);

// Opens the directory at `relative` under `root`, one component at a time (no symlinks).
absl::StatusOr<std::unique_ptr<Directory>> OpenSubdirectory(const Directory& root,
                                                            const std::string& relative);
// Opens the regular file at `relative` under `root`, one component at a time (no symlinks).
absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRelative(const Directory& root,
                                                               const std::string& relative);

// Reads [offset, offset + out.size()) exactly; DATA_LOSS naming `label` and the offset when the
// file ends early (it was truncated) or a read fails.
absl::Status ReadExactly(const RandomAccessFile& file, uint64_t offset, std::span<uint8_t> out,
                         const std::string& label);

// DATA_LOSS for a file whose identity moved from `then` to `now` while it was being read; a
// file that shrank is named with the offset where it now ends.
absl::Status ChangedWhileRead(const std::string& label, const FileIdentity& then,
                              const FileIdentity& now);

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_FILE_SYSTEM_H_
