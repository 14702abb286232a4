// The mini gpt-oss fixtures (tests/data/FIXTURES.md) and pair verification of gpt-oss MXFP4
// against ModelOpt's gpt-oss NVFP4 export: the committed fixtures are what the generator
// writes; the lossless export verifies with every count known by hand; ModelOpt's k_max rule
// on the fixture's large all-zero-group bytes is lossy where (and only where) those bytes are;
// each mutation of a derived copy is named with tensor, expert, row and block.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/codecs.h"
#include "core/quant/format.h"
#include "core/quant/pair_verify.h"
#include "core/quant/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/quant/gpt_oss_fixture.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::quant::testing::RewriteTensors;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

const std::string kSource = "mini-gpt-oss-mxfp4";
const std::string kLossless = "mini-gpt-oss-modelopt-nvfp4";
const std::string kLossy = "mini-gpt-oss-modelopt-lossy";
const std::string kL0 = "model.layers.0.mlp.experts.";
const std::string kL1 = "model.layers.1.mlp.experts.";

absl::StatusOr<PairVerifyResult> TryVerify(const fs::path& src, const fs::path& dst) {
  auto s = Checkpoint::Open(src.string());
  auto d = Checkpoint::Open(dst.string());
  if (!s.ok()) return s.status();
  if (!d.ok()) return d.status();
  PairVerifyOptions opt;
  opt.threads = 2;
  return VerifyPair(**s, **d, opt, NoProgress());
}

PairVerifyResult Verify(const fs::path& src, const fs::path& dst) {
  absl::StatusOr<PairVerifyResult> r = TryVerify(src, dst);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PairVerifyResult{};
}

const PairWindowCount* Window(const PairVerifyResult& r, const std::string& tensor) {
  for (const PairWindowCount& w : r.windows) {
    if (w.tensor == tensor) return &w;
  }
  ADD_FAILURE() << "no window for " << tensor;
  return nullptr;
}

TEST(GptOssFixture, CommittedFilesAreWhatTheGeneratorWrites) {
  TempDir tmp;
  const std::string src = (tmp / kSource).string();
  ASSERT_TRUE(testing::WriteGptOssMxfp4Fixture(src).ok());
  ASSERT_TRUE(testing::WriteGptOssModelOpt(src, (tmp / kLossless).string(),
                                           testing::ModelOptCast::kLossless)
                  .ok());
  ASSERT_TRUE(testing::WriteGptOssModelOpt(src, (tmp / kLossy).string(),
                                           testing::ModelOptCast::kModelOptRule)
                  .ok());
  for (const std::string& d : {kSource, kLossless, kLossy}) {
    for (const auto& e : fs::directory_iterator(Fixture(d))) {
      const fs::path name = e.path().filename();
      EXPECT_EQ(ReadAll(e.path()), ReadAll(tmp / d / name)) << d << "/" << name.string();
    }
  }
}

TEST(GptOssFixture, SourceIsCleanGptOssMxfp4) {
  auto c = Checkpoint::Open(Fixture(kSource).string());
  ASSERT_TRUE(c.ok()) << c.status();
  const FormatReport f = DetectFormat(**c);
  EXPECT_EQ(f.format, QuantFormat::kGptOssMxfp4);
  EXPECT_EQ(f.quantized_modules, 4u);
  EXPECT_EQ(f.findings.total(), 0u) << f.findings.ToJson().dump(2);
}

// quant-check recognises ModelOpt's gpt-oss export by its stacked tensors: both fused tensors of
// both layers, each with its companions checked by name, dtype and shape (docs/formats.md §10).
TEST(GptOssFixture, ModelOptExportIsRecognisedWithItsStackedTensors) {
  auto c = Checkpoint::Open(Fixture(kLossless).string());
  ASSERT_TRUE(c.ok()) << c.status();
  const FormatReport f = DetectFormat(**c);
  EXPECT_EQ(f.format, QuantFormat::kModelOptNvfp4);
  EXPECT_EQ(f.quantized_modules, 4u);
  EXPECT_EQ(f.findings.total(), 0u) << f.findings.ToJson().dump(2);

  TempDir tmp;
  const fs::path dst = CopyFixture(kLossless, tmp);
  RewriteTensors(dst, [](TensorToWrite& t) {
    if (t.name == kL0 + "gate_up_proj_weight_scale") t.shape = {4, 128, 6};
    return t.name != kL1 + "down_proj_weight_scale_2";
  });
  auto bad = Checkpoint::Open(dst.string());
  ASSERT_TRUE(bad.ok()) << bad.status();
  const FormatReport g = DetectFormat(**bad);
  EXPECT_EQ(g.findings.count("group-size"), 1u) << g.findings.ToJson().dump(2);
  EXPECT_EQ(g.findings.count("missing-global-scale"), 1u);
  std::set<std::string> named;
  for (const Finding& x : g.findings.kept()) named.insert(x.tensor);
  EXPECT_TRUE(named.count(kL0 + "gate_up_proj_weight_scale"));
  EXPECT_TRUE(named.count(kL1 + "down_proj_weight_scale_2"));
}

// ckpt-audit's decode of a known element, through the dump the device check compares with
// transformers: layer 0 gate_up_proj expert 0 row 0 group 0 has k = k_max = -4.
TEST(GptOssFixture, DumpDecodesTheFirstGroup) {
  TempDir tmp;
  ASSERT_TRUE(
      testing::DumpGptOssValues(Fixture(kSource).string(), (tmp / "model.safetensors").string())
          .ok());
  auto src = Checkpoint::Open(Fixture(kSource).string());
  ASSERT_TRUE(src.ok());
  const uint8_t* blocks = (*src)->Find(kL0 + "gate_up_proj_blocks")->bytes().data();
  EXPECT_EQ((*src)->Find(kL0 + "gate_up_proj_scales")->bytes()[0], 127 - 4);
  ::ckpt::testing::WriteAll(tmp / "config.json", std::string("{}"));
  auto dump = Checkpoint::Open(tmp.path().string());
  ASSERT_TRUE(dump.ok()) << dump.status();
  auto v = (*dump)->Find(kL0 + "gate_up_proj");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->info->shape, (std::vector<uint64_t>{4, 128, 96}));
  for (int c = 0; c < 32; ++c) {
    const uint8_t b = blocks[c / 2];
    float got;
    std::memcpy(&got, v->bytes().data() + 4 * c, 4);
    EXPECT_EQ(got, DecodeE2M1(c % 2 ? HighNibble(b) : LowNibble(b)) / 16.0f) << c;
  }
}

TEST(GptOssPair, LosslessExportVerifies) {
  const PairVerifyResult r = Verify(Fixture(kSource), Fixture(kLossless));
  EXPECT_TRUE(r.lossless) << r.mismatches.ToJson().dump(2);
  EXPECT_EQ(r.source_format, "gpt-oss-mxfp4");
  EXPECT_EQ(r.derived_kind, "nvfp4");
  EXPECT_EQ(r.quantized_tensors, 4u);
  // gate_up [4, 128, 96] and down [4, 96, 64], two layers.
  EXPECT_EQ(r.packed_bytes_compared, 2u * (4 * 128 * 48 + 4 * 96 * 32));
  EXPECT_EQ(r.value_blocks_compared, 2u * (4 * 128 * 6 + 4 * 96 * 4));
  // Eight all-zero groups per tensor (odd experts, rows 3-6), all with derived scale +0.
  EXPECT_EQ(r.zero_groups_canonicalized, 4u * 8);
  // Embeddings, final norm, head; per layer 2 norms, 8 attention tensors, sinks, router weight
  // and bias, the two expert biases.
  EXPECT_EQ(r.ignored_tensors_compared, 3u + 2 * 15);
  // The window counts every MXFP4 source tensor gets (PairWindowCount), in 16-blocks, two per
  // 32-group, over all experts of a stacked tensor.
  ASSERT_EQ(r.windows.size(), 4u);
  const std::pair<std::string, int> k_max[] = {{kL0 + "gate_up_proj", -4},
                                               {kL0 + "down_proj", -5},
                                               {kL1 + "gate_up_proj", -5},
                                               {kL1 + "down_proj", -6}};
  for (const auto& [name, k] : k_max) {
    const PairWindowCount* w = Window(r, name);
    ASSERT_NE(w, nullptr);
    const uint64_t blocks = 2 * (name.ends_with("gate_up_proj") ? 4 * 128 * 3 : 4 * 96 * 2);
    EXPECT_EQ(w->blocks, blocks) << name;
    EXPECT_EQ(w->lossless_window, blocks) << name;  // span exactly 17: all in the window
    EXPECT_EQ(w->k_max_active, k) << name;
    if (name == kL1 + "down_proj") {  // no large byte on a zero group: ModelOpt agrees
      EXPECT_EQ(w->k_max_modelopt, k);
      EXPECT_EQ(w->modelopt_rule, blocks);
    } else {  // byte 250 sets k_max' = 123: only the bytes 0 and 250 stay in its window
      EXPECT_EQ(w->k_max_modelopt, 123) << name;
      EXPECT_EQ(w->modelopt_rule, 8u) << name;
    }
  }
  // And the ModelOpt-cast hazards of those three tensors, as for any MXFP4 source.
  EXPECT_EQ(r.hazards.count("zero-group-scale-sets-kmax"), 3u) << r.hazards.ToJson().dump();
  EXPECT_EQ(r.hazards.count("modelopt-kmax-lossy-blocks"), 3u) << r.hazards.ToJson().dump();
  EXPECT_EQ(r.hazards.total(), 6u);
}

TEST(GptOssPair, ModelOptRuleOnLargeZeroGroupBytesIsLossy) {
  const PairVerifyResult r = Verify(Fixture(kSource), Fixture(kLossy));
  EXPECT_FALSE(r.lossless);
  // Every active group of the three tensors with a byte-250 zero group requantizes to zero;
  // layer 1's down_proj is exact.
  const uint64_t active = 2 * (4 * 128 * 3 - 8) + (4 * 96 * 2 - 8);
  EXPECT_EQ(r.mismatches.count("packed-bytes-differ"), active);
  EXPECT_EQ(r.mismatches.count("value-differs"), active);
  EXPECT_EQ(r.mismatches.total(), 2 * active);
  for (const Finding& f : r.mismatches.kept()) {
    EXPECT_THAT(f.tensor, ::testing::Not(HasSubstr("layers.1.mlp.experts.down_proj")));
  }
  ASSERT_FALSE(r.mismatches.kept().empty());
  const Finding& first = r.mismatches.kept()[0];
  EXPECT_EQ(first.code, "packed-bytes-differ");
  EXPECT_EQ(first.tensor, kL0 + "down_proj[0]");
  EXPECT_EQ(first.row, 0);
  EXPECT_EQ(first.group, 0);
  EXPECT_THAT(first.message, HasSubstr("expert 0, down row 0, block 0"));
}

// Layer 0 gate_up_proj, expert 2, up row 5 (fused row 11), column 37: derived byte
// (2*48 + 18)*128 + 11, high nibble (tests/quant/gpt_oss_layout_test.cc).
TEST(GptOssPair, FlippedNibbleIsNamedByExpertRowAndBlock) {
  TempDir tmp;
  const fs::path dst = CopyFixture(kLossless, tmp);
  MutateTensor(dst, kL0 + "gate_up_proj", [](uint8_t* p, size_t) { p[14603] ^= 0x70; });
  const PairVerifyResult r = Verify(Fixture(kSource), dst);
  EXPECT_EQ(r.mismatches.total(), 2u) << r.mismatches.ToJson().dump(2);
  ASSERT_EQ(r.mismatches.kept().size(), 2u);
  for (const Finding& f : r.mismatches.kept()) {
    EXPECT_EQ(f.tensor, kL0 + "gate_up_proj[2]");
    EXPECT_EQ(f.row, 11);
    EXPECT_EQ(f.group, 1);
    EXPECT_THAT(f.message, HasSubstr("expert 2, up row 5, block 1"));
  }
  EXPECT_EQ(r.mismatches.count("packed-bytes-differ"), 1u);
  EXPECT_EQ(r.mismatches.count("value-differs"), 1u);
}

// weight_scale of layer 1 down_proj, expert 1, row 0, columns 0-15: [E, 4, 96] -> (1*4)*96.
TEST(GptOssPair, BlockScaleOffByOneExponentIsAValueMismatch) {
  TempDir tmp;
  const fs::path dst = CopyFixture(kLossless, tmp);
  MutateTensor(dst, kL1 + "down_proj_weight_scale", [](uint8_t* p, size_t) { p[384] += 8; });
  const PairVerifyResult r = Verify(Fixture(kSource), dst);
  ASSERT_EQ(r.mismatches.total(), 1u) << r.mismatches.ToJson().dump(2);
  const Finding& f = r.mismatches.kept()[0];
  EXPECT_EQ(f.code, "value-differs");
  EXPECT_EQ(f.tensor, kL1 + "down_proj[1]");
  EXPECT_EQ(f.row, 0);
  EXPECT_EQ(f.group, 0);
  EXPECT_EQ(f.numbers.at("expert"), 1);
}

// weight_scale_2 is a multiplier: storing its reciprocal (a divisor, as compressed-tensors
// does) breaks every active block of that tensor and nothing else.
TEST(GptOssPair, WeightScale2IsAMultiplier) {
  TempDir tmp;
  const fs::path dst = CopyFixture(kLossless, tmp);
  MutateTensor(dst, kL0 + "down_proj_weight_scale_2", [](uint8_t* p, size_t) {
    float f;
    std::memcpy(&f, p, 4);
    f = 1.0f / f;
    std::memcpy(p, &f, 4);
  });
  const PairVerifyResult r = Verify(Fixture(kSource), dst);
  EXPECT_EQ(r.mismatches.count("value-differs"), 4u * 96 * 2 - 8);
  EXPECT_EQ(r.mismatches.total(), 4u * 96 * 2 - 8);
}

// The MXFP4 orientation ([E, R, C/2]) under ModelOpt's name is refused by shape, and a missing
// or non-scalar weight_scale_2 is named.
TEST(GptOssPair, DerivedContractViolationsAreNamed) {
  TempDir tmp;
  const fs::path dst = CopyFixture(kLossless, tmp);
  RewriteTensors(dst, [](TensorToWrite& t) {
    if (t.name == kL0 + "gate_up_proj") t.shape = {4, 128, 48};
    if (t.name == kL1 + "down_proj_weight_scale_2") {
      t.shape = {2};
      t.owned.resize(8);
    }
    return t.name != kL0 + "down_proj_weight_scale_2";
  });
  const PairVerifyResult r = Verify(Fixture(kSource), dst);
  EXPECT_FALSE(r.lossless);
  EXPECT_EQ(r.mismatches.count("derived-tensor-invalid"), 2u) << r.mismatches.ToJson().dump(2);
  EXPECT_EQ(r.mismatches.count("missing-tensor"), 1u);
  bool shape_named = false;
  for (const Finding& f : r.mismatches.kept()) {
    if (f.tensor == kL0 + "gate_up_proj" && f.code == "derived-tensor-invalid") {
      shape_named = true;
      EXPECT_THAT(f.message,
                  HasSubstr("U8 [4,128,48], ModelOpt's gpt-oss export is U8 [4,48,128]"));
    }
  }
  EXPECT_TRUE(shape_named);
}

// A NaN scale byte (0xFF) on an active source group: the derived value cannot equal it, and the
// group is out of our window without moving k_max (ModelOpt's rule takes the byte as 2^128).
// Layer 0 down_proj scales [4, 96, 2]: expert 0, row 1, group 1 -> index 3.
TEST(GptOssPair, NanSourceScaleIsAValueMismatchOutOfTheWindow) {
  TempDir tmp;
  const fs::path src = CopyFixture(kSource, tmp);
  MutateTensor(src, kL0 + "down_proj_scales", [](uint8_t* p, size_t) { p[3] = kE8M0NaN; });
  const PairVerifyResult r = Verify(src, Fixture(kLossless));
  ASSERT_EQ(r.mismatches.count("value-differs"), 1u) << r.mismatches.ToJson().dump(2);
  EXPECT_EQ(r.mismatches.total(), 1u);
  const PairWindowCount* w = Window(r, kL0 + "down_proj");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->k_max_active, -5);
  EXPECT_EQ(w->lossless_window, w->blocks - 2);  // the group's two 16-blocks
  EXPECT_EQ(w->k_max_modelopt, 128);
}

// A config whose dimensions disagree with the stored blocks is an error, never a read past them.
TEST(GptOssPair, ConfigLargerThanTheTensorsIsAnError) {
  TempDir tmp;
  const fs::path src = CopyFixture(kSource, tmp);
  const std::vector<uint8_t> bytes = ReadAll(src / "config.json");
  std::string config(bytes.begin(), bytes.end());
  const size_t at = config.find("\"intermediate_size\": 64");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, 23, "\"intermediate_size\": 96");
  ::ckpt::testing::WriteAll(src / "config.json", config);
  absl::StatusOr<PairVerifyResult> r = TryVerify(src, Fixture(kLossless));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("the source's config needs"));
}

TEST(GptOssPair, DerivedMustBeAModelOptExport) {
  absl::StatusOr<PairVerifyResult> r = TryVerify(Fixture(kSource), Fixture(kSource));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("not a ModelOpt NVFP4 export of gpt-oss"));
}

}  // namespace
}  // namespace ckpt::quant
