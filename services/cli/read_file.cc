#include "services/cli/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::cli {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) {
    if (out.size() + n > max_bytes) {
      std::fclose(f);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than ", max_bytes, " bytes; not a file this command reads"));
    }
    out.append(buf, n);
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = absl::StrCat(path, ".tmp-XXXXXX");
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  ::fchmod(fd, 0644);
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::DataLossError(absl::StrCat(path, ": write failed"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::cli
