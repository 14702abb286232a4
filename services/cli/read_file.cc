#include "services/cli/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/io/small_file.h"

namespace ckpt::cli {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  io::SmallFileRules rules;
  rules.max_bytes = max_bytes;
  return io::ReadSmallFile(path, rules);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode) {
  std::string tmp = absl::StrCat(path, ".tmp-XXXXXX");
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  ::fchmod(fd, mode);
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
