// `ckpt-audit fingerprint` end to end: the JSON it prints agrees with `sha256sum` and with the
// library, and errors give exit code 2.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "core/fingerprint/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Fixture;
using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string out;  // stdout, with stderr appended when asked
};

Result Cli(const std::string& args, bool with_stderr = false) {
  std::string cmd = std::string(::ckpt::testing::kBinaryDir) + "/services/cli/ckpt-audit " + args +
                    (with_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Sha256sum(const std::string& path) {
  FILE* p = ::popen(("sha256sum '" + path + "'").c_str(), "r");
  char buf[65] = {};
  size_t n = p ? std::fread(buf, 1, 64, p) : 0;
  if (p) ::pclose(p);
  return std::string(buf, n);
}

TEST(FingerprintCli, JsonAgreesWithSha256sumAndTheLibrary) {
  const std::string root = Fixture("mini-kimi-mxfp4").string();
  Result r = Cli("fingerprint " + root + " --json --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["files"].size(), 4u);
  for (const auto& f : j["files"]) {
    EXPECT_EQ(f["sha256"], Sha256sum(root + "/" + f["path"].get<std::string>())) << f["path"];
  }
  EXPECT_EQ(j["tensors"].size(), 232u);
  auto fp = FingerprintTree(root, {}, NoProgress());
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(j["manifest"]["root_sha256"], fp->manifest.RootHex());
  EXPECT_EQ(j["manifest"]["resources"].size(), 4u);
  for (size_t i = 0; i < fp->tensors.size(); ++i) {
    EXPECT_EQ(j["tensors"][i]["sha256"], ToHex(fp->tensors[i].sha256));
  }
}

TEST(FingerprintCli, ShardsStatementAndTextShowTheSameRoot) {
  const std::string root = Fixture("mini-kimi-mxfp4").string();
  const std::string shards = " --manifest oms-shards --shard-size 1000000";
  Result statement = Cli("fingerprint " + root + shards + " --statement");
  ASSERT_EQ(statement.exit_code, 0) << statement.out;
  nlohmann::json s = nlohmann::json::parse(statement.out);
  std::string root_hex = s["subject"][0]["digest"]["sha256"];
  EXPECT_EQ(s["predicate"]["resources"].size(), 8u);
  EXPECT_EQ(s["predicate"]["serialization"]["shard_size"], 1000000);
  Result text = Cli("fingerprint " + root + shards + " --no-file-digests");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_THAT(text.out, HasSubstr("ROOT " + root_hex));
}

TEST(FingerprintCli, ErrorsExitWithTwoAndAStatusCode) {
  Result missing = Cli("fingerprint /nonexistent/ckpt-root", true);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.out, HasSubstr("NOT_FOUND"));
  Result bad = Cli("fingerprint " + Fixture("mini-kimi-mxfp4").string() + " --no-file-digests",
                   true);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, HasSubstr("INVALID_ARGUMENT"));
  Result malformed = Cli("fingerprint " + Fixture("malformed").string(), true);
  EXPECT_EQ(malformed.exit_code, 2);
  EXPECT_THAT(malformed.out, HasSubstr(".safetensors"));
  EXPECT_EQ(Cli("fingerprint " + Fixture("malformed").string() + " --no-tensors").exit_code, 0);
}

}  // namespace
}  // namespace ckpt
