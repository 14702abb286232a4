// Regressions found with the Checkpoint::Open fuzz harness (docs/FUZZING.md): each test is one
// input that crashed or misbehaved.
#include <filesystem>
#include <string>

#include "core/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Both quantization_config copies nested 200,000 deep: comparing them recursed once per level
// and overflowed the stack (ASan stack-overflow in basic_json::operator==).
TEST(CheckpointRegression, DeeplyNestedConfigIsRejectedNotAStackOverflow) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  std::string deep = Nested(200000);
  WriteAll(root / "config.json", "{\"quantization_config\":" + deep +
                                     ",\"text_config\":{\"quantization_config\":" + deep + "}}");
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("config.json"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("nested deeper than 64"));
}

TEST(CheckpointRegression, JsonDepthCapAcceptsDepth64AndRejects65) {
  TempDir dir;
  WriteAll(dir / "ok.json", Nested(64));
  WriteAll(dir / "deep.json", Nested(65));
  EXPECT_TRUE(ReadJsonFile((dir / "ok.json").string()).ok());
  auto deep = ReadJsonFile((dir / "deep.json").string());
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
