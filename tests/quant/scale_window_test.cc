// ScaleWindowPolicy on the fixtures and on mutated copies (over-span, NaN scale, hazards).
#include "core/quant/scale_window.h"

#include <algorithm>

#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "core/quant/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

ScaleWindowResult CheckRoot(const std::string& root, ScaleWindowConfig config = {}) {
  auto ckpt = Checkpoint::Open(root);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto r = ScaleWindowPolicy(config).Check(**ckpt, NoProgress(), 2);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

TEST(ScaleWindow, SourceFixtureIsLosslessTranscodable) {
  ScaleWindowResult r = CheckRoot(Fixture("mini-kimi-mxfp4").string());
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kLosslessTranscodable);
  ASSERT_EQ(r.tensors.size(), 96u);
  EXPECT_EQ(r.over_span.total(), 0u);
  EXPECT_EQ(r.nan_scales.total(), 0u);
  // Experts 0, 5, 10, 15 of both layers: three all-zero groups per matrix, all out of window
  // except scale 120 which is in (k = -7 >= k_max - 17).
  uint64_t zero = 0;
  for (const auto& t : r.tensors) zero += t.zero_groups;
  EXPECT_EQ(zero, 2u * 4 * 3 * 3);
  EXPECT_EQ(r.zero_groups_out_of_window, 2u * 4 * 3 * 2);
  // k_max agrees with the oracle's per-tensor k_max, and w1/w3 share it.
  auto oracle = ReadJsonFile(Fixture("oracle/mini-kimi-dequant-sha256.json").string());
  ASSERT_TRUE(oracle.ok());
  for (const auto& [key, kmax] : oracle->at("nvfp4_global_scale_kmax").items()) {
    const size_t dot1 = key.find('.'), dot2 = key.find('.', dot1 + 1);
    const std::string m = "language_model.model.layers." + key.substr(0, dot1) +
                          ".block_sparse_moe.experts." + key.substr(dot1 + 1, dot2 - dot1 - 1) +
                          "." + key.substr(dot2 + 1);
    const TensorScaleStats* t = r.Find(m);
    ASSERT_NE(t, nullptr) << m;
    EXPECT_EQ(t->pair_k_max, kmax.get<int>()) << m;
  }
  // The JSON holds no floats (the evidence record signs it).
  const std::string json = r.ToJson().dump();
  EXPECT_EQ(r.ToJson()["policy"]["id"], "scale-window/1");
  std::function<void(const nlohmann::json&)> no_floats = [&](const nlohmann::json& j) {
    EXPECT_FALSE(j.is_number_float()) << j;
    if (j.is_structured()) for (const auto& e : j) no_floats(e);
  };
  no_floats(r.ToJson());
}

TEST(ScaleWindow, OverSpanGroupIsListedWithCoordinates) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  // Row 3 group 1 of expert 2's w3: scale byte 100 (k = -27) on a group with nonzero values.
  const std::string m = kExpert + "2.w3";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[3 * 64 + 16] = 0x11; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[3 * 4 + 1] = 100; });
  ScaleWindowResult r = CheckRoot(root.string());
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kOverSpan);
  ASSERT_EQ(r.over_span.total(), 1u);
  const Finding& f = r.over_span.kept()[0];
  EXPECT_EQ(f.code, "over-span");
  EXPECT_EQ(f.tensor, m);
  EXPECT_EQ(f.row, 3);
  EXPECT_EQ(f.group, 1);
  EXPECT_EQ(f.numbers.at("k"), -27);
  EXPECT_EQ(f.numbers.at("k_max"), r.Find(m)->pair_k_max.value());
  // Span >= 15 is also a Marlin hazard, for w3 only.
  EXPECT_GE(r.hazards.count("marlin-small-scale-folding"), 1u);
}

TEST(ScaleWindow, FusedPairSharesKMax) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  // Raise one active w1 group of expert 1 by 4 binades: w3's pair_k_max follows.
  const std::string w1 = kExpert + "1.w1";
  ScaleWindowResult before = CheckRoot(root.string());
  const int kmax = before.Find(w1)->pair_k_max.value();
  MutateTensor(root, w1 + ".weight_packed", [](uint8_t* p, size_t) { p[0] = 0x22; });
  MutateTensor(root, w1 + ".weight_scale", [&](uint8_t* p, size_t) { p[0] = 127 + kmax + 4; });
  ScaleWindowResult r = CheckRoot(root.string());
  EXPECT_EQ(r.Find(w1)->pair_k_max, kmax + 4);
  EXPECT_EQ(r.Find(kExpert + "1.w3")->pair_k_max, kmax + 4);
  EXPECT_EQ(r.Find(kExpert + "1.w3")->k_max, before.Find(kExpert + "1.w3")->k_max);
  EXPECT_EQ(r.Find(kExpert + "1.w2")->pair_k_max, before.Find(kExpert + "1.w2")->pair_k_max);
}

TEST(ScaleWindow, NaNScaleOnActiveGroupIsRejectedAndReported) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "4.w2";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[5 * 96 + 2 * 16] |= 0x01; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[5 * 6 + 2] = 0xFF; });
  ScaleWindowResult r = CheckRoot(root.string());
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kNaNScale);
  ASSERT_EQ(r.nan_scales.count("nan-scale"), 1u);
  EXPECT_EQ(r.nan_scales.kept()[0].tensor, m);
  EXPECT_EQ(r.nan_scales.kept()[0].row, 5);
  EXPECT_EQ(r.nan_scales.kept()[0].group, 2);
  EXPECT_EQ(r.Find(m)->nan_scales_active, 1u);
}

TEST(ScaleWindow, Nvfp4FixtureHasNoHazardsUntilW13GlobalsDiffer) {
  ScaleWindowResult clean = CheckRoot(Fixture("mini-kimi-nvfp4").string());
  EXPECT_EQ(clean.verdict, ScaleWindowVerdict::kNotMxfp4);
  EXPECT_EQ(clean.hazards.count("vllm-w13-global-scale-collapse"), 0u);
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  MutateTensor(root, kExpert + "7.w3.weight_global_scale", [](uint8_t* p, size_t) {
    float f;
    std::memcpy(&f, p, 4);
    f *= 2;
    std::memcpy(p, &f, 4);
  });
  ScaleWindowResult r = CheckRoot(root.string());
  ASSERT_EQ(r.hazards.count("vllm-w13-global-scale-collapse"), 1u);
  EXPECT_EQ(r.hazards.kept()[0].tensor, kExpert + "7.w13");
}

TEST(ScaleWindow, ThresholdsAreConfiguration) {
  ScaleWindowConfig strict;
  strict.name = "scale-window-strict";
  strict.version = 2;
  strict.max_span = 1;
  ScaleWindowResult r = CheckRoot(Fixture("mini-kimi-mxfp4").string(), strict);
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kOverSpan);
  EXPECT_EQ(r.ToJson()["policy"]["id"], "scale-window-strict/2");
  EXPECT_GT(r.over_span.total(), r.over_span.kept().size());  // capped listing, full count
  EXPECT_EQ(r.over_span.kept().size(), strict.max_listed);
}

TEST(ScaleWindow, X4TContainerGivesTheSourceStatistics) {
  ScaleWindowResult src = CheckRoot(Fixture("mini-kimi-mxfp4").string());
  ScaleWindowResult x4t = CheckRoot(Fixture("mini-kimi-x4t").string());
  EXPECT_EQ(x4t.verdict, ScaleWindowVerdict::kLosslessTranscodable);
  ASSERT_EQ(src.tensors.size(), x4t.tensors.size());
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    EXPECT_EQ(x4t.tensors[i].kind, "x4t");
    EXPECT_EQ(src.tensors[i].pair_k_max, x4t.tensors[i].pair_k_max);
    EXPECT_EQ(src.tensors[i].active_groups, x4t.tensors[i].active_groups);
  }
}


// A tiny gpt-oss-style checkpoint: 2 experts, gate_up [2, 64, 2, 16] and down [2, 64, 1, 16]
// blocks, every code 0x22 and every scale 127, except `mutate` applied to the gate_up scales.
std::filesystem::path WriteGptOss(const TempDir& dir, const std::function<void(std::vector<uint8_t>&)>& mutate) {
  const std::filesystem::path root = dir / "gpt-oss";
  std::filesystem::create_directory(root);
  const std::string e = "model.layers.0.mlp.experts.";
  std::vector<uint8_t> gu_scales(2 * 64 * 2, 127);
  mutate(gu_scales);
  std::vector<TensorToWrite> t;
  t.push_back(TensorToWrite::Owned(e + "gate_up_proj_blocks", DType::kU8, {2, 64, 2, 16},
                                   std::vector<uint8_t>(2 * 64 * 2 * 16, 0x22)));
  t.push_back(TensorToWrite::Owned(e + "gate_up_proj_scales", DType::kU8, {2, 64, 2}, gu_scales));
  t.push_back(TensorToWrite::Owned(e + "down_proj_blocks", DType::kU8, {2, 64, 1, 16},
                                   std::vector<uint8_t>(2 * 64 * 16, 0x22)));
  t.push_back(TensorToWrite::Owned(e + "down_proj_scales", DType::kU8, {2, 64, 1},
                                   std::vector<uint8_t>(2 * 64, 127)));
  t.push_back(TensorToWrite::Owned("model.layers.0.self_attn.o_proj.weight", DType::kBF16,
                                   {4, 4}, std::vector<uint8_t>(32, 1)));
  EXPECT_TRUE(WriteSafetensors((root / "model.safetensors").string(), std::move(t), {}).ok());
  ::ckpt::testing::WriteAll(root / "config.json",
      std::string(R"({"num_local_experts": 2, "hidden_size": 64, "intermediate_size": 32,
          "quantization_config": {"quant_method": "mxfp4",
                                  "modules_to_not_convert": ["model.layers.0.self_attn"]}})"));
  return root;
}

TEST(ScaleWindow, GptOssBlocksAreCheckedPerExpert) {
  TempDir dir;
  auto root = WriteGptOss(dir, [](std::vector<uint8_t>& s) { s[(64 + 5) * 2 + 1] = 100; });
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  FormatReport f = DetectFormat(**ckpt);
  EXPECT_EQ(f.format, QuantFormat::kGptOssMxfp4);
  EXPECT_EQ(f.findings.total(), 0u) << f.findings.ToJson().dump();
  EXPECT_EQ(f.quantized_modules, 2u);
  ScaleWindowResult r = CheckRoot(root.string());
  ASSERT_EQ(r.tensors.size(), 4u);
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kOverSpan);
  ASSERT_EQ(r.over_span.total(), 1u);
  const Finding& o = r.over_span.kept()[0];
  EXPECT_EQ(o.tensor, "model.layers.0.mlp.experts.gate_up_proj[1]");
  EXPECT_EQ(o.row, 5);
  EXPECT_EQ(o.group, 1);
  EXPECT_EQ(o.numbers.at("k"), -27);
  EXPECT_EQ(o.numbers.at("k_max"), 0);
  EXPECT_EQ(r.Find("model.layers.0.mlp.experts.gate_up_proj[0]")->span(), 0);
}

// One weight_scale_2 per stacked tensor (docs/quant.md "gpt-oss layouts"): the experts share
// k_max. Expert 1's groups all 18 binades below expert 0's are each in their own expert's
// window, but not in the tensor's.
TEST(ScaleWindow, GptOssExpertsOfOneTensorShareKmax) {
  TempDir dir;
  auto root = WriteGptOss(dir, [](std::vector<uint8_t>& s) {
    std::fill(s.begin() + 64 * 2, s.end(), 127 - 18);
  });
  ScaleWindowResult r = CheckRoot(root.string());
  const std::string gu = "model.layers.0.mlp.experts.gate_up_proj";
  ASSERT_NE(r.Find(gu + "[1]"), nullptr);
  EXPECT_EQ(r.Find(gu + "[0]")->pair_k_max, 0);
  EXPECT_EQ(r.Find(gu + "[1]")->pair_k_max, 0);
  EXPECT_EQ(r.Find(gu + "[1]")->fused_group, gu);
  EXPECT_EQ(r.verdict, ScaleWindowVerdict::kOverSpan);
  EXPECT_EQ(r.over_span.total(), 64u * 2);
  EXPECT_EQ(r.over_span.kept()[0].tensor, gu + "[1]");
  EXPECT_EQ(r.over_span.kept()[0].numbers.at("k"), -18);
}

TEST(ScaleWindow, GptOssGeometryComesFromConfig) {
  TempDir dir;
  auto root = WriteGptOss(dir, [](std::vector<uint8_t>&) {});
  auto cfg = ReadJsonFile((root / "config.json").string());
  (*cfg)["intermediate_size"] = 64;
  ::ckpt::testing::WriteAll(root / "config.json", cfg->dump());
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok());
  FormatReport f = DetectFormat(**ckpt);
  EXPECT_EQ(f.findings.count("geometry"), 2u) << f.findings.ToJson().dump();
  EXPECT_EQ(CheckRoot(root.string()).verdict, ScaleWindowVerdict::kLosslessTranscodable);
}

}  // namespace
}  // namespace ckpt::quant
