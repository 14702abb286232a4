// The PIN sources of a pkcs11: key (core/evidence/key_source.h): what a PIN file may be and how
// its line end is read; none of it needs a token.
#include "core/evidence/key_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::evidence {
namespace {

using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;
using ::testing::Not;

class PinSource : public ::testing::Test {
 protected:
  std::string Pin(const std::string& name, const std::string& text, mode_t mode = 0600) {
    std::string path = (dir_ / name).string();
    WriteAll(path, text);
    ::chmod(path.c_str(), mode);
    return path;
  }
  static absl::StatusOr<Pkcs11Access> FromFile(const std::string& path) {
    return Pkcs11AccessOf({"pkcs11:object=k", "/usr/lib/m.so", path, ""});
  }
  ::ckpt::testing::TempDir dir_;
};

TEST_F(PinSource, OneTrailingLineEndIsDropped) {
  for (const std::string& text : {"2718", "2718\n", "2718\r\n"}) {
    auto access = FromFile(Pin("pin", text));
    ASSERT_TRUE(access.ok()) << access.status();
    EXPECT_EQ(access->pin, "2718");
    EXPECT_EQ(access->module, "/usr/lib/m.so");
  }
  auto two = FromFile(Pin("pin", "2718\n\n"));  // only one: the rest is the PIN's
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->pin, "2718\n");
  for (const std::string& text : {"", "\n", "\r\n"}) {
    auto empty = FromFile(Pin("pin", text));
    EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(empty.status().message(), HasSubstr("the PIN is empty"));
  }
}

// Refused without blocking and without the PIN in the message.
TEST_F(PinSource, OnlyAPrivateRegularFileOfAtMostOneKibIsRead) {
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto from_fifo = FromFile(fifo);
  EXPECT_EQ(from_fifo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(from_fifo.status().message(), HasSubstr("not a regular file"));
  auto loose = FromFile(Pin("loose", "s3cret-pin\n", 0640));
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loose.status().message(), HasSubstr("PIN file"));
  EXPECT_THAT(loose.status().message(), Not(HasSubstr("s3cret-pin")));
  // A link is followed (secret volumes mount files as links); the rules hold for its target.
  std::filesystem::create_symlink(dir_ / "loose", dir_ / "link-to-loose");
  EXPECT_EQ(FromFile((dir_ / "link-to-loose").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Pin("tight", "2718\n");
  std::filesystem::create_symlink(dir_ / "tight", dir_ / "link-to-tight");
  auto linked = FromFile((dir_ / "link-to-tight").string());
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->pin, "2718");
  auto huge = FromFile(Pin("huge", std::string(1025, '7')));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("too large"));
}

TEST_F(PinSource, ExactlyOneSourceAndASetVariable) {
  const std::string path = Pin("pin", "2718\n");
  auto both = Pkcs11AccessOf({"pkcs11:object=k", "/usr/lib/m.so", path, "CKPT_TEST_PIN"});
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  auto neither = Pkcs11AccessOf({"pkcs11:object=k", "/usr/lib/m.so", "", ""});
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  auto no_module = Pkcs11AccessOf({"pkcs11:object=k", "", path, ""});
  EXPECT_THAT(no_module.status().message(), HasSubstr("--pkcs11-module"));
  ::unsetenv("CKPT_TEST_PIN");
  auto unset = Pkcs11AccessOf({"pkcs11:object=k", "/usr/lib/m.so", "", "CKPT_TEST_PIN"});
  EXPECT_THAT(unset.status().message(), HasSubstr("CKPT_TEST_PIN: the variable is not set"));
  ::setenv("CKPT_TEST_PIN", "1618", 1);
  auto set = Pkcs11AccessOf({"pkcs11:object=k", "/usr/lib/m.so", "", "CKPT_TEST_PIN"});
  ::unsetenv("CKPT_TEST_PIN");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->pin, "1618");
}

}  // namespace
}  // namespace ckpt::evidence
