// The NVFP4 transcoder: output equals the bundled NVFP4 fixture tensor for tensor, passes pair
// verification, and an over-span or NaN source fails without writing anything.
#include "core/quant/transcode.h"

#include <filesystem>

#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/pair_verify.h"
#include "gtest/gtest.h"
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

absl::StatusOr<TranscodeResult> Transcode(const fs::path& src, const fs::path& dst) {
  auto ckpt = Checkpoint::Open(src.string());
  if (!ckpt.ok()) return ckpt.status();
  return TranscodeToNvfp4(**ckpt, dst.string(), {}, NoProgress());
}

TEST(Transcode, OutputEqualsTheNvfp4FixtureTensorForTensor) {
  TempDir dir;
  auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->modules_transcoded, 96u);
  EXPECT_EQ(r->zero_groups_canonicalized, 2u * 4 * 3 * 3);
  auto got = Checkpoint::Open((dir / "out").string());
  auto want = Checkpoint::Open(Fixture("mini-kimi-nvfp4").string());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok());
  ASSERT_EQ((*got)->TensorNames(), (*want)->TensorNames());
  for (const std::string& name : (*want)->TensorNames()) {
    auto a = (*got)->Find(name);
    auto b = (*want)->Find(name);
    EXPECT_EQ(a->info->dtype, b->info->dtype) << name;
    EXPECT_EQ(a->info->shape, b->info->shape) << name;
    EXPECT_TRUE(std::equal(a->bytes().begin(), a->bytes().end(), b->bytes().begin(),
                           b->bytes().end())) << name;
    EXPECT_EQ((*got)->RelativePath(*a->file), (*want)->RelativePath(*b->file)) << name;
  }
  EXPECT_EQ((*got)->config().at("quantization_config"),
            (*want)->config().at("quantization_config"));
  EXPECT_EQ((*got)->text_config().at("quantization_config"),
            (*want)->text_config().at("quantization_config"));
  // Shards are laid out as the reference writer lays them out: byte-identical files.
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    EXPECT_EQ(::ckpt::testing::ReadAll(dir / "out" / shard),
              ::ckpt::testing::ReadAll(Fixture("mini-kimi-nvfp4") / shard)) << shard;
  }
  // And it passes pair verification against its source.
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto v = VerifyPair(**src, **got, {}, NoProgress());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->lossless) << v->mismatches.ToJson().dump(2);
}

TEST(Transcode, OverSpanSourceFailsNamingTheGroupAndWritesNothing) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "9.w2";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[7 * 96 + 4 * 16 + 3] = 0x70; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[7 * 6 + 4] = 90; });
  auto r = Transcode(root, dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("over-span: " + m + " row 7 group 4"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename(), "mini-kimi-mxfp4") << "left behind: " << e.path();
  }
}

TEST(Transcode, NaNScaleSourceFails) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "3.w1";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[0] = 0x33; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[0] = 0xFF; });
  auto r = Transcode(root, dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(r.status().message()).find("nan-scale: " + m + " row 0 group 0"),
            std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(Transcode, RefusesExistingDestinationAndNonMxfp4Source) {
  TempDir dir;
  fs::create_directory(dir / "out");
  EXPECT_EQ(Transcode(Fixture("mini-kimi-mxfp4"), dir / "out").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Transcode(Fixture("mini-kimi-nvfp4"), dir / "out2").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir / "out2"));
}

}  // namespace
}  // namespace ckpt::quant
