#include "core/io/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::io {
namespace {

// Who a broken mode rule lets do what, and the chmod that fixes it.
absl::Status ModeRefused(const std::string& path, const SmallFileRules& rules, mode_t mode) {
  const mode_t bad = mode & rules.forbidden_mode & 0777;
  const char* verb = (bad & 0222) == bad ? "writable" : (bad & 0444) == bad ? "readable"
                                                                            : "accessible";
  const char* who = (bad & 070) == 0 ? "others" : (bad & 007) == 0 ? "group" : "group and others";
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %s is %s by %s (mode %04o); run chmod %o%s", path, rules.what, verb, who,
      mode & 07777, mode & 0777 & ~rules.forbidden_mode,
      (bad & 0444) != 0 ? " and consider its contents exposed" : ""));
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const SmallFileRules& rules) {
  // O_NONBLOCK: opening a FIFO planted at the path must not hang; it is refused right after.
  const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
                    (rules.follow_link ? 0 : O_NOFOLLOW);
  int fd;
  do {
    fd = ::open(path.c_str(), flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    const std::string why = absl::StrCat(path, ": cannot open ", rules.what, ": ",
                                         std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(why);
    if (err == ELOOP && !rules.follow_link) {
      return absl::PermissionDeniedError(absl::StrCat(
          path, ": ", rules.what, " is a symbolic link, which is refused; give the file itself"));
    }
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  absl::StatusOr<std::string> text = ReadSmallFile(fd, path, rules);
  ::close(fd);
  return text;
}

absl::StatusOr<std::string> ReadSmallFile(int fd, const std::string& path,
                                          const SmallFileRules& rules) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", rules.what,
                                                   " is not a regular file"));
  }
  if ((st.st_mode & rules.forbidden_mode) != 0) return ModeRefused(path, rules, st.st_mode);
  if (rules.owner_root_or_self && st.st_uid != 0 && st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", rules.what, " is owned by uid ", st.st_uid,
                     ", neither root nor this user (uid ", ::geteuid(), "), who could rewrite it"));
  }
  const auto too_large = [&] {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", rules.what, " is too large (over ",
                                                   rules.max_bytes, " bytes)"));
  };
  if (static_cast<uint64_t>(st.st_size) > rules.max_bytes) return too_large();
  // Read to the end whatever the size said (files in /proc say 0; a file may grow meanwhile),
  // one byte past the cap at most, so a larger file is refused, never cut short.
  std::string text(std::min<size_t>(rules.max_bytes + 1, 64u << 10), '\0');
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > rules.max_bytes) return too_large();
      text.resize(std::min(text.size() * 2, rules.max_bytes + 1));
    }
    ssize_t n = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::DataLossError(absl::StrCat(path, ": read error at offset ", got, ": ",
                                              std::strerror(errno)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace ckpt::io
