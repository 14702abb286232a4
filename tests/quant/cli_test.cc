// The quant commands end to end through the ckpt-audit binary: exit codes 0/1/2 and JSON.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

using CliRun = ::ckpt::testing::CliResult;

// Runs `ckpt-audit ARGS`: exit code (rc), stdout and stderr.
// XDG_DATA_HOME in the scratch directory: transcode signs its provenance with the per-user key.
CliRun Cli(const std::string& args) {
  static const TempDir scratch;
  return ::ckpt::testing::RunCli(args, scratch.path(),
                                 "XDG_DATA_HOME='" + (scratch / "xdg").string() + "'");
}

const std::string kSrc = Fixture("mini-kimi-mxfp4").string();

TEST(QuantCli, VerifyPairExitCodesAndJson) {
  CliRun ok = Cli("verify-pair --json --source " + kSrc + " --derived " +
               Fixture("mini-kimi-nvfp4").string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["verdict"], "lossless");

  CliRun unmapped = Cli("verify-pair --source " + kSrc + " --derived " + Fixture("mini-kimi-x4t").string());
  EXPECT_EQ(unmapped.rc, 1);
  EXPECT_NE(unmapped.out.find("derived:checkpoint-root-mismatch"), std::string::npos) << unmapped.out;

  CliRun mapped = Cli("verify-pair --json --source " + kSrc + " --derived " +
                   Fixture("mini-kimi-x4t").string() + " --map-root /x4t=" +
                   Fixture("mini-kimi-x4t").string());
  EXPECT_EQ(mapped.rc, 0) << mapped.out;

  CliRun swapped = Cli("verify-pair --source " + Fixture("mini-kimi-nvfp4").string() +
                    " --derived " + kSrc);
  EXPECT_EQ(swapped.rc, 2);
  EXPECT_EQ(Cli("verify-pair --source " + kSrc).rc, 2);  // missing --derived
}

TEST(QuantCli, VerifyPairListsAtMostMaxFindings) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  MutateTensor(root, kExpert + "0.w1.weight_packed",
               [](uint8_t* p, size_t n) { for (size_t i = 0; i < n; ++i) p[i] ^= 0x11; });
  CliRun r = Cli("verify-pair --json --max-findings 3 --source " + kSrc + " --derived " + root.string());
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "mismatch");
  EXPECT_EQ(j["mismatches"]["listed"].size(), 3u);
  EXPECT_EQ(j["mismatches"]["by_code"]["packed-bytes-differ"], 192 * 4);
  EXPECT_EQ(j["mismatches"]["listed"][0]["row"], 0);
}

TEST(QuantCli, TranscodeWritesAVerifiablePairOrNothing) {
  TempDir dir;
  CliRun ok = Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "nv").string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(Cli("verify-pair --source " + kSrc + " --derived " + (dir / "nv").string()).rc, 0);
  EXPECT_EQ(Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "nv").string()).rc, 2);

  auto bad = CopyFixture("mini-kimi-mxfp4", dir);
  MutateTensor(bad, kExpert + "1.w2.weight_scale", [](uint8_t* p, size_t) { p[0] = 60; });
  CliRun refused = Cli("transcode --to nvfp4 " + bad.string() + " " + (dir / "nv2").string());
  EXPECT_EQ(refused.rc, 1);
  EXPECT_FALSE(fs::exists(dir / "nv2"));
  EXPECT_EQ(Cli("transcode --to mxfp8 " + kSrc + " " + (dir / "nv3").string()).rc, 2);
}

TEST(QuantCli, QuantCheck) {
  CliRun ok = Cli("quant-check --json " + kSrc);
  EXPECT_EQ(ok.rc, 0) << ok.out;
  auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["scale_window"]["verdict"], "lossless-transcodable");
  EXPECT_EQ(j["scale_window"]["policy"]["id"], "scale-window/1");
  EXPECT_EQ(Cli("quant-check " + Fixture("mini-kimi-x4t").string()).rc, 1);  // root
  EXPECT_EQ(Cli("quant-check /nonexistent").rc, 2);
}

}  // namespace
}  // namespace ckpt::quant
