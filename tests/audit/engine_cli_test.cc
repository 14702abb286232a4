// Every command that reads tensor data runs the one engine (core/audit/engine.h) in its
// --memory-window: a window several times smaller than the fixture pair gives the output of an
// unbounded run, inspect reads headers only, and the flag takes sizes as docs/audit-engine.md
// says.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Several times smaller than the 10 MB fixture pair, larger than its largest unit.
constexpr char kSmall[] = "--memory-window 1M";
constexpr char kLarge[] = "--memory-window 4GiB";

std::string Fixture(const char* name) { return (fs::path(::ckpt::testing::kTestDataDir) / name).string(); }

class EngineCliTest : public ::testing::Test {
 protected:
  // The command's stdout in both windows; both must succeed with the same exit code.
  std::string SameInBothWindows(const std::string& args, int expected_rc) {
    CliResult small = RunCli(args + " " + kSmall, tmp_.path());
    CliResult large = RunCli(args + " " + kLarge, tmp_.path());
    EXPECT_EQ(small.rc, expected_rc) << args << "\n" << small.err;
    EXPECT_EQ(large.rc, expected_rc) << args << "\n" << large.err;
    EXPECT_EQ(small.out, large.out) << args;
    EXPECT_FALSE(small.out.empty()) << args;
    return small.out;
  }

  TempDir tmp_;
};

TEST_F(EngineCliTest, QuantCheckInASmallWindowEqualsTheUnboundedRun) {
  for (const char* root : {"mini-kimi-mxfp4", "mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    const std::string out = SameInBothWindows(
        "quant-check --json " + Fixture(root) + " --map-root /x4t=" + Fixture("mini-kimi-x4t"), 0);
    auto j = nlohmann::json::parse(out);
    EXPECT_TRUE(j["passed"].get<bool>()) << root;
  }
}

TEST_F(EngineCliTest, VerifyPairInASmallWindowEqualsTheUnboundedRun) {
  for (const char* derived : {"mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    const std::string out = SameInBothWindows(
        "verify-pair --json --source " + Fixture("mini-kimi-mxfp4") + " --derived " +
            Fixture(derived) + " --map-root /x4t=" + Fixture("mini-kimi-x4t"),
        0);
    auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["verdict"], "lossless") << derived;
    EXPECT_GT(j["value_blocks_compared"].get<uint64_t>(), 0u) << derived;
  }
}

TEST_F(EngineCliTest, VerifyPairFindsAFlippedByteInASmallWindow) {
  const fs::path derived = tmp_ / "derived";
  fs::copy(Fixture("mini-kimi-nvfp4"), derived, fs::copy_options::recursive);
  const fs::path shard = derived / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> bytes = ReadAll(shard);
  bytes[bytes.size() - 100] ^= 0x11;
  WriteAll(shard, bytes);
  const std::string out = SameInBothWindows(
      "verify-pair --json --source " + Fixture("mini-kimi-mxfp4") + " --derived " +
          derived.string(),
      1);
  EXPECT_EQ(nlohmann::json::parse(out)["verdict"], "mismatch");
}

TEST_F(EngineCliTest, DiffInASmallWindowEqualsTheUnboundedRun) {
  const fs::path a = fs::path(Fixture("mini-kimi-nvfp4")) / "model-00001-of-00002.safetensors";
  ASSERT_GT(fs::file_size(a), 2u << 20);  // larger than the small window
  auto same = nlohmann::json::parse(
      SameInBothWindows("diff --json " + a.string() + " " + a.string(), 0));
  EXPECT_EQ(same["verdict"], "identical");
  EXPECT_GT(same["tensors_compared"].get<uint64_t>(), 10u);

  const fs::path b = tmp_ / "b.safetensors";
  std::vector<uint8_t> bytes = ReadAll(a);
  bytes[bytes.size() - 1] ^= 0x01;
  WriteAll(b, bytes);
  auto differ = nlohmann::json::parse(
      SameInBothWindows("diff --json " + a.string() + " " + b.string(), 1));
  EXPECT_EQ(differ["verdict"], "different");
  EXPECT_EQ(differ["tensors_equal"].get<uint64_t>() + 1,
            differ["tensors_compared"].get<uint64_t>());
}

TEST_F(EngineCliTest, InspectInASmallWindowEqualsTheUnboundedRun) {
  // inspect reads no tensor data, so the window only has to hold the small files and headers.
  SameInBothWindows("inspect --json " + Fixture("mini-kimi-nvfp4"), 0);
}

// A header claiming 64 GiB of tensor data in a sparse file: inspect answers from the header
// without reading (or allocating) the data, as a file or as a checkpoint root.
TEST_F(EngineCliTest, InspectReadsOnlyHeaders) {
  const uint64_t data = 64ull << 30;
  const std::string json = "{\"w\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(data) +
                           "],\"data_offsets\":[0," + std::to_string(data) + "]}}";
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  const fs::path root = tmp_ / "big";
  fs::create_directories(root);
  const fs::path file = root / "model.safetensors";
  WriteAll(file, head + json);
  fs::resize_file(file, 8 + json.size() + data);
  WriteAll(root / "config.json", std::string("{}"));

  for (const fs::path& target : {file, root}) {
    CliResult r = RunCli("inspect --json " + target.string(), tmp_.path());
    ASSERT_EQ(r.rc, 0) << target << "\n" << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tensor_bytes"].get<uint64_t>(), data) << target;
  }
}

TEST_F(EngineCliTest, MemoryWindowTakesSizesAndRefusesNonsense) {
  const std::string root = Fixture("mini-kimi-nvfp4");
  for (const char* ok : {"1048576", "1M", "1MiB", "1.5G", "2GiB", "1536k"}) {
    CliResult r = RunCli(std::string("quant-check ") + root + " --memory-window " + ok,
                         tmp_.path());
    EXPECT_EQ(r.rc, 0) << ok << "\n" << r.err;
  }
  for (const char* bad : {"0", "1K", "abc", "1.5", "12X", "99999999999999999999", "16777216T",
                          "-1", "1.0000000001K"}) {
    for (const char* cmd : {"quant-check", "inspect", "audit"}) {
      CliResult r = RunCli(std::string(cmd) + " " + root + " --memory-window " + bad,
                           tmp_.path());
      EXPECT_EQ(r.rc, 2) << cmd << " " << bad;
      EXPECT_THAT(r.err, HasSubstr("--memory-window")) << cmd << " " << bad;
      EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT")) << cmd << " " << bad;
    }
  }
}

TEST(ParseByteSizeTest, BinaryUnits) {
  EXPECT_EQ(*cli::ParseByteSize("0"), 0u);
  EXPECT_EQ(*cli::ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*cli::ParseByteSize("256M"), 256ull << 20);
  EXPECT_EQ(*cli::ParseByteSize("256mib"), 256ull << 20);
  EXPECT_EQ(*cli::ParseByteSize("1.5G"), 1536ull << 20);
  EXPECT_EQ(*cli::ParseByteSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*cli::ParseByteSize("0.5K"), 512u);
  EXPECT_EQ(*cli::ParseByteSize("16777215T"), 16777215ull << 40);
  EXPECT_EQ(*cli::ParseByteSize("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "G", ".5G", "1.G", "1.5", "1e9", "1 G", "1GB", "1Gi", "-1",
                          "18446744073709551616", "16777216T", "0.1K", "1.0000000001K"}) {
    absl::StatusOr<uint64_t> v = cli::ParseByteSize(bad);
    EXPECT_FALSE(v.ok()) << "'" << bad << "' gave " << (v.ok() ? *v : 0);
    if (!v.ok()) EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ckpt::testing
