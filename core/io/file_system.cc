#include "core/io/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/io/fd.h"

namespace ckpt::io {
namespace {

absl::Status ErrnoStatus(const std::string& what, const std::string& label, int err) {
  std::string msg = absl::StrCat(label, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::DataLossError(msg);
}

absl::StatusOr<FileIdentity> FstatOf(int fd, const std::string& label) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat", label, errno);
  return FileIdentity::Of(st);
}

// The label of an opened directory is where it actually is, not the name that led to it: the
// path /proc/self/fd gives for the descriptor, checked to lead back to the same directory. A
// directory whose real path cannot be established that way (deeper than PATH_MAX, moved or
// removed meanwhile, /proc missing) is refused: naming it by the path it was asked for would
// let "/allowed/../elsewhere" pass for a directory under /allowed (docs/daemon.md "Semantics").
absl::StatusOr<std::string> RealPathOf(int fd, const std::string& asked) {
  char buf[PATH_MAX];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf));
  const int err = errno;
  struct stat by_path, by_fd;
  std::string real = n > 0 && static_cast<size_t>(n) < sizeof(buf) ? std::string(buf, n) : "";
  if (real.empty() || real[0] != '/' || ::stat(real.c_str(), &by_path) != 0 ||
      ::fstat(fd, &by_fd) != 0 || by_path.st_dev != by_fd.st_dev ||
      by_path.st_ino != by_fd.st_ino) {
    return absl::InvalidArgumentError(absl::StrCat(
        asked, ": the real path of this directory cannot be established (",
        n < 0 ? std::strerror(err)
              : real.empty() ? "longer than PATH_MAX" : "it has moved or is unreachable",
        "); refused rather than named by the path given"));
  }
  return real;
}

class PosixFile final : public RandomAccessFile {
 public:
  PosixFile(int fd, std::string label) : fd_(fd), label_(std::move(label)) {}

  absl::StatusOr<size_t> Read(uint64_t offset, std::span<uint8_t> out) const override {
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::pread(fd_.get(), out.data() + done, out.size() - done,
                          static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(absl::StrCat("read at offset ", offset + done), label_, errno);
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  absl::StatusOr<FileIdentity> Identity() const override { return FstatOf(fd_.get(), label_); }

  void Consumed(uint64_t offset, uint64_t length) const override {
    ::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length),
                    POSIX_FADV_DONTNEED);
  }

 private:
  const Fd fd_;
  const std::string label_;
};

class PosixDirectory final : public Directory {
 public:
  PosixDirectory(int fd, std::string label) : fd_(fd), label_(std::move(label)) {}

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& name) const override {
    const std::string label = Child(name);
    if (absl::Status s = CheckName(name, label); !s.ok()) return s;
    // O_NONBLOCK: opening a FIFO must not hang; it is refused as non-regular right after.
    int fd = ::openat(fd_.get(), name.c_str(),
                      O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return OpenError(errno, label);
    auto file = std::make_unique<PosixFile>(fd, label);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": not a regular file"));
    }
    return file;
  }

  absl::StatusOr<std::unique_ptr<Directory>> OpenDirectory(
      const std::string& name) const override {
    const std::string label = Child(name);
    if (absl::Status s = CheckName(name, label); !s.ok()) return s;
    int fd = ::openat(fd_.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECTORY);
    if (fd < 0) return OpenError(errno, label);
    return std::make_unique<PosixDirectory>(fd, label);
  }

  absl::StatusOr<std::vector<DirEntry>> List() const override {
    // fdopendir takes ownership of its descriptor, so list through a duplicate.
    int dup = ::openat(fd_.get(), ".", O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    if (dup < 0) return ErrnoStatus("open for listing", label_, errno);
    DIR* dir = ::fdopendir(dup);
    if (dir == nullptr) {
      int err = errno;
      ::close(dup);
      return ErrnoStatus("fdopendir", label_, err);
    }
    std::vector<DirEntry> out;
    errno = 0;
    while (struct dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st;
      EntryType type = EntryType::kOther;
      if (::fstatat(fd_.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISREG(st.st_mode)) type = EntryType::kRegular;
        else if (S_ISDIR(st.st_mode)) type = EntryType::kDirectory;
        else if (S_ISLNK(st.st_mode)) type = EntryType::kSymlink;
      }
      out.push_back({std::move(name), type});
      errno = 0;
    }
    int err = errno;
    ::closedir(dir);
    if (err != 0) return ErrnoStatus("readdir", label_, err);
    return out;
  }

  absl::StatusOr<FileIdentity> StatAt(const std::string& name) const override {
    struct stat st;
    if (::fstatat(fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoStatus("stat", Child(name), errno);
    }
    return FileIdentity::Of(st);
  }

  absl::StatusOr<FileIdentity> Identity() const override { return FstatOf(fd_.get(), label_); }
  const std::string& label() const override { return label_; }

  absl::StatusOr<std::string> ReadLink(const std::string& name) const override {
    const std::string label = Child(name);
    if (absl::Status s = CheckName(name, label); !s.ok()) return s;
    char buf[PATH_MAX];
    ssize_t n = ::readlinkat(fd_.get(), name.c_str(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINVAL) return absl::InvalidArgumentError(absl::StrCat(label, ": not a symbolic link"));
      return ErrnoStatus("readlink", label, errno);
    }
    if (static_cast<size_t>(n) == sizeof(buf)) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": link text longer than PATH_MAX"));
    }
    return std::string(buf, static_cast<size_t>(n));
  }

  absl::StatusOr<std::unique_ptr<Directory>> OpenParent() const override {
    int fd = ::openat(fd_.get(), "..", O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    if (fd < 0) return ErrnoStatus("open parent", label_, errno);
    absl::StatusOr<std::string> real = RealPathOf(fd, absl::StrCat(label_, "/.."));
    if (!real.ok()) {
      ::close(fd);
      return real.status();
    }
    return std::make_unique<PosixDirectory>(fd, *std::move(real));
  }

 private:
  std::string Child(const std::string& name) const { return absl::StrCat(label_, "/", name); }

  static absl::Status CheckName(const std::string& name, const std::string& label) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": not a single path component"));
    }
    return absl::OkStatus();
  }

  absl::Status OpenError(int err, const std::string& label) const {
    if (err == ELOOP || err == EMLINK) {
      return absl::PermissionDeniedError(absl::StrCat(label, ": symbolic link refused"));
    }
    if (err == ENOTDIR) return absl::InvalidArgumentError(absl::StrCat(label, ": not a directory"));
    return ErrnoStatus("open", label, err);
  }

  const Fd fd_;
  const std::string label_;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<Directory>> OpenRoot(const std::string& path) const override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECTORY);
    if (fd < 0) {
      return absl::NotFoundError(absl::StrCat(path, ": not a directory: ", std::strerror(errno)));
    }
    absl::StatusOr<std::string> real = RealPathOf(fd, path);
    if (!real.ok()) {
      ::close(fd);
      return real.status();
    }
    return std::make_unique<PosixDirectory>(fd, *std::move(real));
  }
};

}  // namespace

FileIdentity FileIdentity::Of(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

const FileSystem& RealFileSystem() {
  static const PosixFileSystem* fs = new PosixFileSystem();
  return *fs;
}

absl::StatusOr<std::vector<std::string>> PathComponents(const std::string& relative) {
  if (relative.empty() || relative[0] == '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", relative, "': not a relative path"));
  }
  std::vector<std::string> parts = absl::StrSplit(relative, '/');
  for (const std::string& p : parts) {
    if (p.empty() || p == "." || p == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("'", relative, "': empty, '.' or '..' path component"));
    }
  }
  return parts;
}

absl::StatusOr<std::unique_ptr<Directory>> OpenSubdirectory(const Directory& root,
                                                            const std::string& relative) {
  absl::StatusOr<std::vector<std::string>> parts = PathComponents(relative);
  if (!parts.ok()) return parts.status();
  std::unique_ptr<Directory> dir;
  for (const std::string& p : *parts) {
    absl::StatusOr<std::unique_ptr<Directory>> next = (dir ? *dir : root).OpenDirectory(p);
    if (!next.ok()) return next.status();
    dir = *std::move(next);
  }
  return dir;
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRelative(const Directory& root,
                                                               const std::string& relative) {
  const size_t slash = relative.rfind('/');
  if (slash == std::string::npos) return root.OpenFile(relative);
  absl::StatusOr<std::unique_ptr<Directory>> dir = OpenSubdirectory(root, relative.substr(0, slash));
  if (!dir.ok()) return dir.status();
  return (*dir)->OpenFile(relative.substr(slash + 1));
}

absl::Status ReadExactly(const RandomAccessFile& file, uint64_t offset, std::span<uint8_t> out,
                         const std::string& label) {
  absl::StatusOr<size_t> n = file.Read(offset, out);
  if (!n.ok()) return n.status();
  if (*n != out.size()) {
    return absl::DataLossError(absl::StrCat(label, ": file ends at offset ", offset + *n,
                                            ", expected ", out.size() - *n,
                                            " more bytes (truncated while being read?)"));
  }
  return absl::OkStatus();
}

absl::Status ChangedWhileRead(const std::string& label, const FileIdentity& then,
                              const FileIdentity& now) {
  if (now.size < then.size) {
    return absl::DataLossError(absl::StrCat(label, ": file ends at offset ", now.size,
                                            ", expected ", then.size - now.size,
                                            " more bytes (truncated while being read?)"));
  }
  return absl::DataLossError(absl::StrCat(
      label, ": changed while being read (inode, size, mtime or ctime moved)"));
}

}  // namespace ckpt::io
