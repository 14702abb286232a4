// `ckpt-audit forward` end to end through the binary: exit codes 0/1/2, JSON and --output.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/forward/fixture_mutation.h"
#include "tests/test_util.h"

namespace ckpt::forward {
namespace {

using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

using CliRun = ::ckpt::testing::CliResult;

// Runs `ckpt-audit forward ARGS`: exit code (rc), stdout and stderr.
CliRun Cli(const std::string& args) {
  static const TempDir scratch;
  return ::ckpt::testing::RunCli("forward " + args, scratch.path());
}

const std::string kSource = " --source " + Fixture("mini-kimi-mxfp4").string();

TEST(ForwardCli, IdenticalPairExitsZeroWithJson) {
  TempDir dir;
  const std::string out = (dir / "y.safetensors").string();
  CliRun r = Cli("--root " + Fixture("mini-kimi-x4t").string() + kSource +
                 " --layer 1 --tokens 4 --seed 9 --precision f32 --json --output " + out);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "bit-identical");
  EXPECT_EQ(j["precision"], "f32");
  EXPECT_EQ(j["input"]["tokens"], 4);
  auto f = SafetensorsFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NE((*f)->Find("latent_out_normed"), nullptr);
}

TEST(ForwardCli, MutatedPairExitsOne) {
  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-nvfp4", dir);
  // Every expert gets one scale changed: whichever are selected, the output differs.
  for (int e = 0; e < 16; ++e) {
    ScaleOneByPowerOfTwo(copy, "language_model.model.layers.1.block_sparse_moe.experts." +
                             std::to_string(e) + ".w2");
  }
  CliRun r = Cli("--root " + copy.string() + kSource + " --layer 1");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("verdict: different"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DIFFERENT"), std::string::npos) << r.out;
}

TEST(ForwardCli, BadInputExitsTwo) {
  const std::string root = " --root " + Fixture("mini-kimi-nvfp4").string();
  EXPECT_EQ(Cli(root + " --layer 0").rc, 2);             // dense layer
  EXPECT_EQ(Cli(root + " --layer 1 --precision f16").rc, 2);
  EXPECT_EQ(Cli(root + " --layer 1 --device tpu").rc, 2);
  EXPECT_EQ(Cli("--layer 1").rc, 2);                      // no --root
  EXPECT_EQ(Cli(root + " --layer 1 --input " +
                Fixture("malformed/valid_e8m0.safetensors").string()).rc, 2);
}

}  // namespace
}  // namespace ckpt::forward
