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

std::string LastLine(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t at = s.rfind('\n');
  return at == std::string::npos ? s : s.substr(at + 1);
}

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

TEST(ForwardCli, EveryLayerWithSummaryAndEmulation) {
  CliRun r = Cli("--root " + Fixture("mini-kimi-nvfp4").string() + kSource +
                 " --layers all --tokens 2 --precision f32 --emulate vllm-w13-collapse");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: bit-identical (2 of 2 layers passed)"), std::string::npos)
      << r.out;
  CliRun j = Cli("--root " + Fixture("mini-kimi-nvfp4").string() + kSource +
                 " --layers 2 --tokens 2 --json");
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["summary"][0]["layer"], 2);

  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-nvfp4", dir);
  for (int e = 0; e < 16; ++e) {
    HalveGlobalAndBlockScales(copy, "language_model.model.layers.2.block_sparse_moe.experts." +
                                        std::to_string(e) + ".w3");
  }
  const std::string mutated = "--root " + copy.string() + kSource + " --layers all --tokens 2";
  EXPECT_EQ(Cli(mutated).rc, 0) << "lossless on disk";
  CliRun e = Cli(mutated + " --emulate vllm-w13-collapse");
  EXPECT_EQ(e.rc, 1) << e.out;
  EXPECT_NE(e.out.find("vllm-w13-collapse (16 experts changed) vs source: output different"),
            std::string::npos) << e.out;
  // The summary leads with the emulated divergence that makes the exit code 1.
  EXPECT_EQ(LastLine(e.out),
            "verdict: emulated vllm-w13-collapse output DIFFERS on 1 of 2 layers (layer 2); "
            "stored weights: bit-identical (2 of 2 layers passed)")
      << e.out;
  CliRun one = Cli("--root " + copy.string() + kSource +
                   " --layer 2 --tokens 2 --emulate vllm-w13-collapse");
  EXPECT_EQ(one.rc, 1) << one.out;
  EXPECT_EQ(LastLine(one.out),
            "verdict: emulated vllm-w13-collapse output DIFFERS on 1 of 1 layers (layer 2); "
            "stored weights: bit-identical")
      << one.out;
}

// Both trees are read in --memory-window: a window smaller than one layer gives the same
// report; sizes that are no window are refused, and a window no unit fits names the flag.
TEST(ForwardCli, MemoryWindow) {
  const std::string args = "--root " + Fixture("mini-kimi-nvfp4").string() + kSource +
                           " --layers all --tokens 4 --json";
  CliRun unbounded = Cli(args);
  ASSERT_EQ(unbounded.rc, 0) << unbounded.err;
  for (const char* window : {"1M", "1048576", "1.5M", "1MiB"}) {
    CliRun bounded = Cli(args + " --memory-window " + window);
    ASSERT_EQ(bounded.rc, 0) << window << ": " << bounded.err;
    EXPECT_EQ(bounded.out, unbounded.out) << window;
  }
  for (const char* bad : {"0", "1x", "1.5", "65535", "0.5K", "-1", "99999999999999999999", "M"}) {
    CliRun r = Cli(args + " --memory-window " + std::string(bad));
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << bad << ": " << r.err;
  }
  CliRun tiny = Cli(args + " --memory-window 64K");
  EXPECT_EQ(tiny.rc, 2) << tiny.out;
  EXPECT_NE(tiny.err.find("RESOURCE_EXHAUSTED"), std::string::npos) << tiny.err;
  EXPECT_NE(tiny.err.find("--memory-window"), std::string::npos) << tiny.err;
}

// gpt-oss's ModelOpt NVFP4 export against its MXFP4 source through the binary: `forward
// --layers all` and `audit --forward-layers all` exit 0 (the same report in a window smaller
// than one layer of the two trees), and the lossy export exits 1 naming its layers.
TEST(ForwardCli, GptOssModelOptExport) {
  const std::string source = " --source " + Fixture("mini-gpt-oss-mxfp4").string();
  const std::string args = "--root " + Fixture("mini-gpt-oss-modelopt-nvfp4").string() + source +
                           " --layers all --json";
  CliRun unbounded = Cli(args);
  ASSERT_EQ(unbounded.rc, 0) << unbounded.out << unbounded.err;
  EXPECT_EQ(nlohmann::json::parse(unbounded.out)["verdict"], "bit-identical");
  for (const char* window : {"1M", "144K"}) {
    CliRun bounded = Cli(args + " --memory-window " + window);
    ASSERT_EQ(bounded.rc, 0) << window << ": " << bounded.err;
    EXPECT_EQ(bounded.out, unbounded.out) << window;
  }
  CliRun lossy = Cli("--root " + Fixture("mini-gpt-oss-modelopt-lossy").string() + source +
                     " --layers all");
  EXPECT_EQ(lossy.rc, 1) << lossy.out << lossy.err;
  EXPECT_NE(lossy.out.find("verdict: different (0 of 2 layers passed)"), std::string::npos)
      << lossy.out;

  TempDir dir;
  ASSERT_EQ(::ckpt::testing::RunCli("keys generate --out " + (dir / "k.pem").string() +
                                        " --trust " + (dir / "trust").string(),
                                    dir.path())
                .rc,
            0);
  auto audit = [&](const std::string& derived) {
    return ::ckpt::testing::RunCli("audit " + Fixture(derived).string() + source +
                                       " --forward-layers all --json --db " +
                                       (dir / "log.db").string() + " --key " +
                                       (dir / "k.pem").string(),
                                   dir.path());
  };
  CliRun pass = audit("mini-gpt-oss-modelopt-nvfp4");
  ASSERT_EQ(pass.rc, 0) << pass.out << pass.err;
  CliRun fail = audit("mini-gpt-oss-modelopt-lossy");
  EXPECT_EQ(fail.rc, 1) << fail.out << fail.err;
  const nlohmann::json j = nlohmann::json::parse(fail.out);
  bool seen = false;
  for (const auto& check : j["checks"]) {
    if (check["name"] != "block_forward") continue;
    seen = true;
    EXPECT_EQ(check["verdict"], "fail");
  }
  EXPECT_TRUE(seen) << fail.out;
}

TEST(ForwardCli, DiffExitCodes) {
  TempDir dir;
  const std::string a = (dir / "a.safetensors").string(), b = (dir / "b.safetensors").string();
  ASSERT_EQ(Cli("--root " + Fixture("mini-kimi-nvfp4").string() + " --layer 1 --tokens 2 "
                "--precision f32 --output " + a).rc, 0);
  ASSERT_EQ(Cli("--root " + Fixture("mini-kimi-x4t").string() + " --layer 2 --tokens 2 "
                "--precision f32 --output " + b).rc, 0);
  static const TempDir scratch;
  auto same = ::ckpt::testing::RunCli("diff " + a + " " + a, scratch.path());
  EXPECT_EQ(same.rc, 0) << same.out << same.err;
  auto differ = ::ckpt::testing::RunCli("diff " + a + " " + b, scratch.path());
  EXPECT_EQ(differ.rc, 1) << differ.out;
  EXPECT_NE(differ.out.find("output"), std::string::npos);
  EXPECT_EQ(::ckpt::testing::RunCli("diff " + a + " " + (dir / "none").string(), scratch.path()).rc,
            2);
}

// Without a usable GPU a GPU audit is refused before anything is read or signed; with one it
// runs there.
TEST(ForwardCli, GpuAuditNeedsAGpu) {
  TempDir dir;
  const std::string args = "audit " + Fixture("mini-kimi-nvfp4").string() + kSource +
                           " --forward-layers all --device cuda --db " +
                           (dir / "log.db").string() + " --key " + (dir / "k.pem").string() +
                           " --json";
  auto r = ::ckpt::testing::RunCli(args, dir.path());
  if (r.rc == 2) {
    EXPECT_NE(r.err.find("FAILED_PRECONDITION"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "log.db")) << "nothing may be logged";
  } else {
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["checks"][4]["name"], "block_forward");
  }
  auto no_layers = ::ckpt::testing::RunCli(
      "audit " + Fixture("mini-kimi-nvfp4").string() + " --device cuda --db " +
          (dir / "log2.db").string() + " --key " + (dir / "k.pem").string(),
      dir.path());
  EXPECT_EQ(no_layers.rc, 2);
}

TEST(ForwardCli, BadInputExitsTwo) {
  const std::string root = " --root " + Fixture("mini-kimi-nvfp4").string();
  EXPECT_EQ(Cli(root + " --layer 0").rc, 2);             // dense layer
  EXPECT_EQ(Cli(root + " --layer 1 --precision f16").rc, 2);
  EXPECT_EQ(Cli(root + " --layer 1 --device tpu").rc, 2);
  EXPECT_EQ(Cli("--layer 1").rc, 2);                      // no --root
  EXPECT_EQ(Cli(root + " --layer 1 --layers all").rc, 2);
  EXPECT_EQ(Cli(root).rc, 2);                             // neither
  EXPECT_EQ(Cli(root + " --layers 0,1").rc, 2);           // 0 is dense
  EXPECT_EQ(Cli(root + " --layers all --emulate sglang").rc, 2);
  EXPECT_EQ(Cli(root + " --layers all --output /tmp/x.safetensors").rc, 2);
  EXPECT_EQ(Cli(root + " --layer 1 --input " +
                Fixture("malformed/valid_e8m0.safetensors").string()).rc, 2);
}

}  // namespace
}  // namespace ckpt::forward
