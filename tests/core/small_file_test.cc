// The one small-file reader (core/io/small_file.h): whole or not at all, a regular file only,
// links refused unless allowed, the caller's mode and owner rules checked on what was opened.
#include "core/io/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

TEST(SmallFile, ReadsWholeUpToTheCapAndRefusesOneByteMore) {
  TempDir dir;
  const std::string path = (dir / "f").string();
  SmallFileRules rules;
  rules.max_bytes = 100000;  // more than one internal read buffer
  WriteAll(path, std::string(rules.max_bytes, 'x'));
  auto whole = ReadSmallFile(path, rules);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), rules.max_bytes);

  WriteAll(path, std::string(rules.max_bytes + 1, 'x'));
  auto over = ReadSmallFile(path, rules);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr(path + ": file is too large"));
  EXPECT_EQ(ReadSmallFile((dir / "missing").string(), rules).status().code(),
            absl::StatusCode::kNotFound);
}

// A file whose size says 0 (as /proc files do) is read to its end, and the cap still holds.
TEST(SmallFile, ReadsPastTheStatedSizeButNotPastTheCap) {
  SmallFileRules rules;
  auto status = ReadSmallFile("/proc/self/status", rules);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(*status, HasSubstr("Name:"));
  rules.max_bytes = 16;
  EXPECT_EQ(ReadSmallFile("/proc/self/status", rules).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SmallFile, SymlinkRefusedUnlessTheCallerFollowsIt) {
  TempDir dir;
  WriteAll(dir / "real", std::string("secret\n"));
  fs::create_symlink(dir / "real", dir / "link");
  SmallFileRules rules;
  rules.what = "token file";
  auto refused = ReadSmallFile((dir / "link").string(), rules);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr((dir / "link").string() + ": token file is a symbolic link"));
  rules.follow_link = true;
  auto followed = ReadSmallFile((dir / "link").string(), rules);
  ASSERT_TRUE(followed.ok()) << followed.status();
  EXPECT_EQ(*followed, "secret\n");
}

// A FIFO, a directory or a device is refused at once; nothing blocks.
TEST(SmallFile, OnlyRegularFiles) {
  TempDir dir;
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  SmallFileRules rules;
  for (const std::string& path : {fifo, dir.path().string(), std::string("/dev/zero")}) {
    auto r = ReadSmallFile(path, rules);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("not a regular file")) << path;
  }
}

TEST(SmallFile, ModeAndOwnerRules) {
  TempDir dir;
  const std::string path = (dir / "key").string();
  WriteAll(path, std::string("k"));
  SmallFileRules rules;
  rules.what = "private key";
  rules.forbidden_mode = 077;
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(ReadSmallFile(path, rules).ok());
  ::chmod(path.c_str(), 0640);
  auto group = ReadSmallFile(path, rules);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(group.status().message()),
              HasSubstr("private key is readable by group (mode 0640); run chmod 600 and "
                        "consider its contents exposed"));
  rules.forbidden_mode = 022;
  ::chmod(path.c_str(), 0646);
  EXPECT_THAT(std::string(ReadSmallFile(path, rules).status().message()),
              HasSubstr("writable by others (mode 0646); run chmod 644"));
  ::chmod(path.c_str(), 0644);
  EXPECT_TRUE(ReadSmallFile(path, rules).ok());

  // The rules hold for the descriptor read, whatever opened it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ::fchmod(fd, 0664);
  EXPECT_EQ(ReadSmallFile(fd, path, rules).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ::fchmod(fd, 0644);
  auto by_fd = ReadSmallFile(fd, path, rules);
  ::close(fd);
  ASSERT_TRUE(by_fd.ok()) << by_fd.status();
  EXPECT_EQ(*by_fd, "k");

  // Owned by another user, who could rewrite it (setting that up needs root, as CI runs).
  rules.owner_root_or_self = true;
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(path.c_str(), 4242, 4242), 0);
    auto other = ReadSmallFile(path, rules);
    EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(other.status().message()), HasSubstr("owned by uid 4242"));
  }
}

}  // namespace
}  // namespace ckpt::io
