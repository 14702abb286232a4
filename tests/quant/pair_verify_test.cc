// Pair verification: the fixture pairs are lossless; each mutation of a copied derived (or
// source) checkpoint is reported under its own name with coordinates.
#include "core/quant/pair_verify.h"

#include <cstring>
#include <filesystem>

#include "core/checkpoint.h"
#include "core/progress.h"
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

PairVerifyResult Verify(const fs::path& src, const fs::path& dst, size_t max_findings = 20,
                        std::vector<RootMapping> root_map = {}) {
  auto s = Checkpoint::Open(src.string());
  auto d = Checkpoint::Open(dst.string());
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(d.ok()) << d.status();
  PairVerifyOptions opt;
  opt.max_findings = max_findings;
  opt.threads = 2;
  opt.format.root_map = std::move(root_map);
  auto r = VerifyPair(**s, **d, opt, NoProgress());
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(PairVerify, Nvfp4FixtureIsLossless) {
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), Fixture("mini-kimi-nvfp4"));
  EXPECT_TRUE(r.lossless) << r.mismatches.ToJson().dump(2);
  EXPECT_EQ(r.derived_kind, "nvfp4");
  EXPECT_EQ(r.quantized_tensors, 96u);
  EXPECT_EQ(r.fused_groups_checked, 32u);
  EXPECT_EQ(r.zero_groups_canonicalized, 2u * 4 * 3 * 3);
  EXPECT_GT(r.ignored_tensors_compared, 0u);
  EXPECT_EQ(r.verdict(), "lossless");
}

TEST(PairVerify, X4TFixtureIsLosslessOnceItsRootIsMapped) {
  PairVerifyResult unmapped = Verify(Fixture("mini-kimi-mxfp4"), Fixture("mini-kimi-x4t"));
  EXPECT_FALSE(unmapped.lossless);
  EXPECT_EQ(unmapped.mismatches.total(), 1u);
  EXPECT_EQ(unmapped.mismatches.count("derived:checkpoint-root-mismatch"), 1u);
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), Fixture("mini-kimi-x4t"), 20,
                              {{"/x4t", Fixture("mini-kimi-x4t").string()}});
  EXPECT_TRUE(r.lossless) << r.mismatches.ToJson().dump(2);
  EXPECT_EQ(r.derived_kind, "x4t");
  EXPECT_EQ(r.quantized_tensors, 96u);
}

TEST(PairVerify, FlippedNibbleIsAPackedAndValueMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  const std::string m = kExpert + "6.w1";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[10 * 64 + 2 * 16 + 5] ^= 0x10; });
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  ASSERT_EQ(r.mismatches.count("packed-bytes-differ"), 1u);
  EXPECT_EQ(r.mismatches.count("value-differs"), 1u);
  const Finding& f = r.mismatches.kept()[0];
  EXPECT_EQ(f.tensor, m);
  EXPECT_EQ(f.row, 10);
  EXPECT_EQ(f.group, 2);
}

TEST(PairVerify, ScaleOffByAPowerOfTwoIsAValueMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  const std::string m = kExpert + "2.w2";
  // Find an active block: E4M3 power-of-two scales step by 8 per binade.
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(src.ok());
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[4 * 12 + 7] += 8; });
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  ASSERT_EQ(r.mismatches.count("value-differs"), 1u);
  EXPECT_EQ(r.mismatches.count("packed-bytes-differ"), 0u);
  EXPECT_EQ(r.mismatches.kept()[0].row, 4);
  EXPECT_EQ(r.mismatches.kept()[0].group, 3);  // 16-block 7 is in 32-group 3
}

TEST(PairVerify, ChangedDenseTensorIsReportedByDigest) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  const std::string t = "language_model.model.layers.0.self_attn.q_proj.weight";
  MutateTensor(root, t, [](uint8_t* p, size_t n) { p[n - 1] ^= 1; });
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  ASSERT_EQ(r.mismatches.count("ignored-tensor-differs"), 1u);
  EXPECT_EQ(r.mismatches.kept()[0].tensor, t);
  EXPECT_NE(r.mismatches.kept()[0].message.find("sha256"), std::string::npos);
}

TEST(PairVerify, MissingTensorIsAnInventoryMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  // Drop one dense tensor from the index and shard header by renaming it in both.
  const std::string t = "language_model.model.layers.0.mlp.up_proj.weight";
  const std::string renamed = "language_model.model.layers.0.mlp.up_proX.weight";
  for (const char* f : {"model-00001-of-00002.safetensors", "model.safetensors.index.json"}) {
    std::vector<uint8_t> b = ::ckpt::testing::ReadAll(root / f);
    std::string s(b.begin(), b.end());
    const size_t at = s.find("\"" + t + "\"");
    ASSERT_NE(at, std::string::npos) << f;
    s.replace(at + 1, t.size(), renamed);
    ::ckpt::testing::WriteAll(root / f, s);
  }
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  EXPECT_EQ(r.mismatches.count("missing-tensor"), 1u);
  EXPECT_EQ(r.mismatches.count("extra-tensor"), 1u);
}

TEST(PairVerify, W13GlobalScalesDifferingIsAMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  // Halve w3's global scale and halve its block scales: values are unchanged, but vLLM would
  // load w3 with w1's global scale.
  const std::string w3 = kExpert + "11.w3";
  MutateTensor(root, w3 + ".weight_global_scale", [](uint8_t* p, size_t) {
    float f;
    std::memcpy(&f, p, 4);
    f /= 2;
    std::memcpy(p, &f, 4);
  });
  MutateTensor(root, w3 + ".weight_scale", [](uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) if (p[i] >= 8) p[i] -= 8;  // normal E4M3: one binade down
  });
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  EXPECT_EQ(r.mismatches.count("value-differs"), 0u) << r.mismatches.ToJson().dump(2);
  ASSERT_EQ(r.mismatches.count("fused-global-scale-differs"), 1u);
  EXPECT_EQ(r.mismatches.kept()[0].tensor, kExpert + "11.w13");
}

TEST(PairVerify, CorruptX4TScaleStreamAndListingCap) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-x4t", dir);
  MutateTensor(root, kExpert + "0.w1.weight_scale.exact_mxfp4_fixed",
               [](uint8_t* p, size_t) { p[0] += 3; });  // row 0's base byte
  MutateTensor(root, kExpert + "1.w1.weight_packed",
               [](uint8_t* p, size_t n) { for (size_t i = 0; i < n; ++i) p[i] ^= 0x01; });
  PairVerifyResult r = Verify(Fixture("mini-kimi-mxfp4"), root, 5);
  EXPECT_FALSE(r.lossless);
  EXPECT_EQ(r.mismatches.count("x4t-stream-invalid") + r.mismatches.count("scale-differs") > 0, true);
  EXPECT_EQ(r.mismatches.count("packed-bytes-differ"), 192u * 4);
  EXPECT_EQ(r.mismatches.kept().size(), 5u);
}

TEST(PairVerify, NaNSourceScaleIsAValueMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "8.w3";
  auto src = Checkpoint::Open(root.string());
  ASSERT_TRUE(src.ok());
  // Find an active group: row 0 group 0 of every expert in the fixture has nonzero nibbles?
  auto packed = (*src)->Find(m + ".weight_packed");
  bool active = false;
  for (int i = 0; i < 16; ++i) active |= (packed->bytes()[i] & 0x77) != 0;
  ASSERT_TRUE(active);
  src->reset();
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[0] = 0xFF; });
  PairVerifyResult r = Verify(root, Fixture("mini-kimi-nvfp4"));
  EXPECT_FALSE(r.lossless);
  ASSERT_EQ(r.mismatches.count("value-differs"), 1u);
  EXPECT_EQ(r.mismatches.kept()[0].tensor, m);
}

}  // namespace
}  // namespace ckpt::quant
