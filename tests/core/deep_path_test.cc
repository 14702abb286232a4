// A root whose real path cannot be established (longer than PATH_MAX) is refused by name, never
// labelled with the path it was asked for: "/allowed/../elsewhere/..." must not pass for a
// directory under /allowed (docs/daemon.md "Semantics"). The daemon's allow-list half is in
// tests/daemon/daemon_cli_test.cc.
#include <filesystem>
#include <string>

#include "core/io/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/deep_tree.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::DeepTree;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

TEST(DeepPath, OpenRootRefusesWhatItCannotName) {
  TempDir dir;
  DeepTree tree(dir.path());
  ASSERT_GT(tree.real_length(), static_cast<size_t>(PATH_MAX));
  fs::create_directory(tree.deep() / "M");
  const std::string asked = (dir / "elsewhere/../h5/M").string();
  fs::create_directory(dir / "elsewhere");
  auto opened = io::RealFileSystem().OpenRoot(asked);
  ASSERT_FALSE(opened.ok()) << "labelled " << (*opened)->label();
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(opened.status().message()),
              HasSubstr(asked + ": the real path of this directory cannot be established"));
  // Its parent cannot be named either; a shallow directory still opens under its real path.
  auto shallow = io::RealFileSystem().OpenRoot((dir / "elsewhere/..").string());
  ASSERT_TRUE(shallow.ok()) << shallow.status();
  EXPECT_EQ((*shallow)->label(), fs::canonical(dir.path()).string());
}

TEST(DeepPath, CliFingerprintAndAuditRefuse) {
  TempDir dir;
  DeepTree tree(dir.path());
  fs::copy(Fixture("mini-kimi-mxfp4"), tree.deep() / "M", fs::copy_options::recursive);
  const std::string root = (tree.deep() / "M").string();
  CliResult fp = RunCli("fingerprint '" + root + "'", dir.path());
  EXPECT_EQ(fp.rc, 2) << fp.out;
  EXPECT_THAT(fp.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(fp.err, HasSubstr("real path of this directory cannot be established"));
  CliResult key = RunCli("keys generate --out " + (dir / "k.pem").string() + " --trust " +
                             (dir / "trust").string(),
                         dir.path());
  ASSERT_EQ(key.rc, 0) << key.err;
  CliResult audit = RunCli("audit '" + root + "' --db " + (dir / "ev.db").string() + " --key " +
                               (dir / "k.pem").string(),
                           dir.path());
  EXPECT_EQ(audit.rc, 2) << audit.out;
  EXPECT_THAT(audit.err, HasSubstr("real path of this directory cannot be established"));
}

}  // namespace
}  // namespace ckpt
