// ModelOpt NVFP4 (docs/formats.md §9, docs/quant.md "ModelOpt NVFP4"): the converted mini-Kimi
// fixture is read value for value as the compressed-tensors original, detected under both config
// shapes and MIXED_PRECISION with alias spellings, clean of findings, proven lossless against its
// MXFP4 source; each bad input and hazard gives its named finding.
#include <cmath>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/dequant.h"
#include "core/quant/format.h"
#include "core/quant/pair_verify.h"
#include "core/quant/quant_weight.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/scale_window.h"
#include "gtest/gtest.h"
#include "tests/quant/modelopt_fixture.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::Codes;
using ::ckpt::quant::testing::Detect;
using ::ckpt::quant::testing::EditJson;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::ModelOptFixtureOptions;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::quant::testing::WriteModelOptCastOfMxfp4;
using ::ckpt::quant::testing::WriteModelOptFixture;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using nlohmann::json;

fs::path Convert(const TempDir& dir, const ModelOptFixtureOptions& o = {},
                 const std::string& name = "modelopt") {
  const fs::path dst = dir / name;
  absl::Status s = WriteModelOptFixture(Fixture("mini-kimi-nvfp4"), dst, o);
  EXPECT_TRUE(s.ok()) << s;
  return dst;
}

std::unique_ptr<Checkpoint> Open(const fs::path& root) {
  auto c = Checkpoint::Open(root.string());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}


ScaleWindowResult Window(const fs::path& root) {
  auto c = Open(root);
  auto r = ScaleWindowPolicy().Check(*c, NoProgress(), 2);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : ScaleWindowResult{};
}

PairVerifyResult Pair(const fs::path& src, const fs::path& dst) {
  auto s = Open(src);
  auto d = Open(dst);
  PairVerifyOptions o;
  o.threads = 2;
  auto r = VerifyPair(*s, *d, o, NoProgress());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PairVerifyResult{};
}

void SetF32(const fs::path& root, const std::string& tensor, float v) {
  MutateTensor(root, tensor, [v](uint8_t* p, size_t n) {
    ASSERT_EQ(n, 4u);
    std::memcpy(p, &v, 4);
  });
}

// Every module reads as the same exact values as the compressed-tensors original (the global
// read as a multiplier 1/g equals the divisor g), packed bytes are unchanged, and every other
// tensor is byte-identical.
TEST(ModelOptFixture, ConvertedFixtureMatchesTheOriginalValueByValue) {
  TempDir dir;
  const fs::path root = Convert(dir);
  auto ct = Open(Fixture("mini-kimi-nvfp4"));
  auto mo = Open(root);
  const std::vector<std::string> modules = PackedModules(*mo);
  ASSERT_EQ(modules, PackedModules(*ct));
  ASSERT_EQ(modules.size(), 96u);
  for (const std::string& m : modules) {
    auto w = ResolveWeight(*mo, m);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->kind, WeightKind::kNvfp4);
    EXPECT_EQ(w->global_role, GlobalRole::kMultiplier);
    EXPECT_EQ(w->global_scale->info->shape, std::vector<uint64_t>{});
    EXPECT_EQ(w->packed.info->name, m + ".weight");
    auto a = DequantizeWeight(*ct, m);
    auto b = DequantizeWeight(*w);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      ASSERT_EQ(std::signbit((*a)[i]), std::signbit((*b)[i])) << m << " element " << i;
      ASSERT_EQ((*a)[i], (*b)[i]) << m << " element " << i;
    }
    const auto pa = ct->Find(m + ".weight_packed")->bytes();
    const auto pb = w->packed.bytes();
    ASSERT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin(), pb.end())) << m;
  }
  for (const std::string& n : ct->TensorNames()) {
    if (n.find("block_sparse_moe.experts.") != std::string::npos) continue;
    auto a = ct->Find(n)->bytes();
    auto b = mo->Find(n);
    ASSERT_TRUE(b.has_value()) << n;
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b->bytes().begin(), b->bytes().end())) << n;
  }
}

TEST(ModelOptFixture, RefusesAGlobalThatIsNotAPowerOfTwo) {
  TempDir dir;
  const fs::path ct = CopyFixture("mini-kimi-nvfp4", dir);
  SetF32(ct, kExpert + "3.w2.weight_global_scale", 3.0f);
  absl::Status s = WriteModelOptFixture(ct, dir / "out");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("3.w2.weight_global_scale"), std::string::npos) << s;
}

// A U8 `.weight` is ModelOpt's packed weight, never a plain weight; without its scales it is an
// error naming the tensor, not a matrix of bytes.
TEST(ModelOptWeight, U8WeightIsNeverAPlainWeight) {
  TempDir dir;
  ModelOptFixtureOptions o;
  o.drop = {kExpert + "2.w1.weight_scale"};
  const fs::path root = Convert(dir, o);
  auto c = Open(root);
  auto w = ResolveWeight(*c, kExpert + "2.w1");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("2.w1.weight_scale: missing"), std::string::npos)
      << w.status();
  EXPECT_EQ(Detect(root).findings.count("missing-scale"), 1u);
}

TEST(ModelOptDetect, BothConfigShapesAloneOrTogetherAreCleanAndW4A4) {
  for (auto [hf, cfg] : {std::pair{true, true}, {true, false}, {false, true}}) {
    TempDir dir;
    ModelOptFixtureOptions o;
    o.write_hf_quant_config = hf;
    o.write_config_json = cfg;
    const FormatReport r = Detect(Convert(dir, o));
    EXPECT_EQ(r.format, QuantFormat::kModelOptNvfp4) << hf << cfg;
    EXPECT_EQ(r.activations, "W4A4");
    EXPECT_EQ(r.group_size, 16);
    EXPECT_EQ(r.quantized_modules, 96u);
    EXPECT_EQ(r.findings.total(), 0u) << hf << cfg << " " << Codes(r.findings);
  }
}

TEST(ModelOptDetect, W4A16AndScalarsOfShapeOneAreClean) {
  TempDir dir;
  ModelOptFixtureOptions o;
  o.quant_algo = "W4A16_NVFP4";
  o.scalars_as_1 = true;
  const fs::path root = Convert(dir, o);
  const FormatReport r = Detect(root);
  EXPECT_EQ(r.activations, "A16");
  EXPECT_EQ(r.Describe(), "modelopt/nvfp4 (W4A16)");
  EXPECT_EQ(r.findings.total(), 0u) << Codes(r.findings);
  EXPECT_FALSE(Open(root)->Find(kExpert + "0.w1.input_scale").has_value());
}

// Kimi-K3's MIXED_PRECISION manifest: every module under several alias spellings.
json K3QuantizedLayers(bool with_aliases) {
  json layers = json::object();
  const json entry = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
  for (int l : {1, 2}) {
    for (int e = 0; e < 16; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        const std::string tail = absl::StrCat(l, ".block_sparse_moe.experts.", e, ".", w);
        layers["language_model.model.layers." + tail] = entry;
        if (!with_aliases) continue;
        layers["model.layers." + tail] = entry;
        layers[absl::StrCat("layers.", l, ".mlp.experts.", e, ".", w)] = entry;
      }
    }
  }
  return layers;
}

void MakeMixed(const fs::path& root, const json& layers) {
  EditJson(root / "config.json", [&](json& c) {
    json& q = c["quantization_config"];
    q["quant_method"] = "modelopt_mixed";
    q["quant_algo"] = "MIXED_PRECISION";
    q["quantized_layers"] = layers;
  });
  EditJson(root / "hf_quant_config.json", [&](json& c) {
    c["quantization"]["quant_algo"] = "MIXED_PRECISION";
    c["quantization"]["quantized_layers"] = layers;
  });
}

TEST(ModelOptDetect, MixedPrecisionWithK3AliasSpellingsIsClean) {
  TempDir dir;
  const fs::path root = Convert(dir);
  MakeMixed(root, K3QuantizedLayers(true));
  const FormatReport r = Detect(root);
  EXPECT_EQ(r.format, QuantFormat::kModelOptNvfp4);
  EXPECT_EQ(r.activations, "mixed");
  EXPECT_EQ(r.findings.total(), 0u) << Codes(r.findings);
}

TEST(ModelOptDetect, MixedPrecisionFindings) {
  TempDir dir;
  const fs::path root = Convert(dir);
  json layers = K3QuantizedLayers(true);
  // Two spellings of one module with different entries; an unsupported algorithm; a spelling
  // naming nothing; a module no spelling names; a W4A16 entry whose module has an input_scale.
  layers["layers.1.mlp.experts.4.w2"]["group_size"] = 32;
  for (const std::string k : {"language_model.model.layers.2.block_sparse_moe.experts.9.w1",
                              "model.layers.2.block_sparse_moe.experts.9.w1",
                              "layers.2.mlp.experts.9.w1"}) {
    layers[k]["quant_algo"] = "INT8_SQ";
  }
  layers["model.layers.7.mlp.experts.0.w1"] = {{"quant_algo", "NVFP4"}, {"group_size", 16}};
  for (const std::string p : {"language_model.model.", "model.", ""}) {
    const std::string tail = "layers.2.block_sparse_moe.experts.15.w3";
    layers.erase(p + tail);
  }
  layers.erase("layers.2.mlp.experts.15.w3");
  for (const std::string p : {"language_model.model.layers.", "model.layers."}) {
    layers[p + "1.block_sparse_moe.experts.6.w1"]["quant_algo"] = "W4A16_NVFP4";
  }
  layers["layers.1.mlp.experts.6.w1"]["quant_algo"] = "W4A16_NVFP4";
  MakeMixed(root, layers);
  const FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("alias-collision"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("group-size"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("unsupported-quant-algo"), 3u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("quantized-layer-absent"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("quantized-unlisted"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("extra-tensor"), 1u) << Codes(r.findings);
}

// Issue 22 item 6: a manifest spelling that names two stored modules is never resolved to one
// of them. Beside layer 1's expert 0 w1 the tree stores a dense `model.layers.1...w1.weight` in
// a shard of its own, so the K3 spelling "model.layers.1.block_sparse_moe.experts.0.w1" names
// both; the other spellings still name the quantized module, which stays listed.
TEST(ModelOptDetect, SpellingThatNamesTwoStoredModulesIsAmbiguous) {
  TempDir dir;
  const fs::path root = Convert(dir);
  MakeMixed(root, K3QuantizedLayers(true));
  ASSERT_EQ(Detect(root).findings.total(), 0u);
  const std::string tail = "layers.1.block_sparse_moe.experts.0.w1";
  const std::string stray = "model." + tail + ".weight";
  ASSERT_TRUE(WriteSafetensors((root / "model-extra.safetensors").string(),
                               {TensorToWrite::Owned(stray, DType::kBF16, {2, 2},
                                                     std::vector<uint8_t>(8, 0))},
                               {})
                  .ok());
  EditJson(root / "model.safetensors.index.json",
           [&](json& i) {
             i["weight_map"][stray] = "model-extra.safetensors";
             i["metadata"]["total_size"] = i["metadata"]["total_size"].get<uint64_t>() + 8;
           });
  const FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("alias-ambiguous"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.total(), 1u) << Codes(r.findings);
  const Finding& f = r.findings.kept()[0];
  EXPECT_EQ(f.tensor, "model." + tail);
  EXPECT_NE(f.message.find("language_model.model." + tail + ", model." + tail),
            std::string::npos)
      << f.message;
}

TEST(ModelOptDetect, BadConfigsAreNamedFindings) {
  const auto detect_after = [](const std::function<void(const fs::path&)>& edit) {
    TempDir dir;
    const fs::path root = Convert(dir);
    edit(root);
    return Detect(root);
  };
  FormatReport r = detect_after([](const fs::path& root) {
    EditJson(root / "hf_quant_config.json",
             [](json& c) { c["quantization"]["quant_algo"] = "W4A16_NVFP4"; });
  });
  EXPECT_EQ(r.findings.count("config-disagreement"), 1u) << Codes(r.findings);
  r = detect_after([](const fs::path& root) {
    EditJson(root / "config.json", [](json& c) { c["quantization_config"]["quant_algo"] = "FP8"; });
    EditJson(root / "hf_quant_config.json", [](json& c) { c["quantization"]["quant_algo"] = "FP8"; });
  });
  EXPECT_EQ(r.findings.count("unsupported-quant-algo"), 1u) << Codes(r.findings);
  r = detect_after([](const fs::path& root) {
    for (const char* f : {"config.json", "hf_quant_config.json"}) {
      EditJson(root / f, [](json& c) {
        json& list = c.contains("quantization") ? c["quantization"]["exclude_modules"]
                                                : c["quantization_config"]["ignore"];
        list.push_back("*vision_tower*");       // matches nothing
        list.push_back("[abc");                 // unterminated class
        list.push_back("*experts.1[0-1].w2");   // covers experts 10 and 11's w2 in two layers
      });
    }
  });
  EXPECT_EQ(r.warnings.count("exclude-matches-nothing"), 1u) << Codes(r.warnings);
  EXPECT_EQ(r.findings.count("exclude-matches-nothing"), 0u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("bad-pattern"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("ignore-covers-quantized"), 4u) << Codes(r.findings);
  r = detect_after([](const fs::path& root) {
    EditJson(root / "hf_quant_config.json", [](json& c) { c["quantization"].erase("group_size"); });
    EditJson(root / "config.json", [](json& c) { c.erase("quantization_config"); });
  });
  EXPECT_EQ(r.format, QuantFormat::kModelOptNvfp4);
  EXPECT_EQ(r.findings.count("config-field-missing"), 1u) << Codes(r.findings);
  r = detect_after([](const fs::path& root) {
    std::ofstream(root / "hf_quant_config.json", std::ios::trunc) << "{\"producer\": ";
  });
  EXPECT_EQ(r.findings.count("config-unreadable"), 1u) << Codes(r.findings);
  r = detect_after([](const fs::path& root) {
    EditJson(root / "hf_quant_config.json", [](json& c) { c["producer"]["name"] = "other"; });
  });
  EXPECT_EQ(r.findings.count("config-unreadable"), 1u) << Codes(r.findings);
}

TEST(ModelOptContract, WeightScale2ShapeAndCompleteness) {
  TempDir dir;
  ModelOptFixtureOptions o;
  o.odd_global_module = kExpert + "5.w2";
  o.odd_global_shape = {1, 1};
  o.drop = {kExpert + "8.w3.weight_scale_2", kExpert + "9.w2.weight_scale_2",
            kExpert + "12.w1.input_scale"};
  o.stray_global_on = "language_model.model.layers.1.self_attn.q_proj";
  const fs::path root = Convert(dir, o);
  const FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("global-scale-shape"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("w13-missing-global-scale"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("missing-global-scale"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("missing-input-scale"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("extra-tensor"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.total(), 5u) << Codes(r.findings);
  auto c = Open(root);
  auto w = ResolveWeight(*c, kExpert + "5.w2");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
}

// A routed expert's gate_proj/up_proj (DeepSeek-style names) are vLLM's fused w13 as w1/w3 are:
// up_proj without weight_scale_2 beside a gate_proj that has one is w13-missing-global-scale.
TEST(ModelOptContract, ExpertUpProjMissingWeightScale2BesideGateIsW13Missing) {
  TempDir dir;
  const fs::path mo = Convert(dir);
  const std::string e0 = kExpert + "0.";
  const fs::path root = dir / "expert-gate-up";
  ::ckpt::quant::testing::WriteCheckpointFrom(mo, root, [&](const std::string& n) -> std::string {
    if (!absl::StartsWith(n, e0)) return "";
    if (absl::StartsWith(n, e0 + "w1.")) return e0 + "gate_proj." + n.substr(e0.size() + 3);
    if (n == e0 + "w3.weight_scale_2") return "";
    if (absl::StartsWith(n, e0 + "w3.")) return e0 + "up_proj." + n.substr(e0.size() + 3);
    return n;
  });
  const FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("w13-missing-global-scale"), 1u) << Codes(r.findings);
  EXPECT_EQ(r.findings.count("missing-global-scale"), 0u) << Codes(r.findings);
  for (const Finding& f : r.findings.kept()) {
    if (f.code != "w13-missing-global-scale") continue;
    EXPECT_EQ(f.tensor, e0 + "up_proj.weight_scale_2");
    EXPECT_NE(f.message.find("while " + e0 + "gate_proj has one"), std::string::npos) << f.message;
  }
}

TEST(ModelOptHazards, CleanFixtureHasNone) {
  TempDir dir;
  const ScaleWindowResult r = Window(Convert(dir));
  EXPECT_EQ(r.nan_scales.total(), 0u) << Codes(r.nan_scales);
  EXPECT_EQ(r.hazards.total(), 0u) << Codes(r.hazards);
  EXPECT_EQ(r.tensors.size(), 96u);
}

TEST(ModelOptHazards, BlockScalesAndScalarsGiveNamedFindings) {
  TempDir dir;
  const fs::path root = Convert(dir);
  const std::string m = kExpert + "1.w1";  // [192, 128]: 8 blocks a row
  // Row 3: block 2 NaN (0x7F), block 4 zero; the codes of both are nonzero in the fixture.
  MutateTensor(root, m + ".weight", [](uint8_t* p, size_t) {
    p[3 * 64 + 2 * 8] = 0x11;
    p[3 * 64 + 4 * 8] = 0x11;
  });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) {
    p[3 * 8 + 2] = 0x7F;
    p[3 * 8 + 4] = 0x00;
  });
  SetF32(root, kExpert + "2.w2.weight_scale_2", 0.0f);
  SetF32(root, kExpert + "3.w2.weight_scale_2", std::nanf(""));
  SetF32(root, kExpert + "4.w2.input_scale", INFINITY);
  SetF32(root, kExpert + "7.w3.weight_scale_2", 2.0f);
  const ScaleWindowResult r = Window(root);
  ASSERT_EQ(r.nan_scales.count("nan-scale"), 1u) << Codes(r.nan_scales);
  ASSERT_EQ(r.nan_scales.count("zero-block-scale"), 1u) << Codes(r.nan_scales);
  EXPECT_EQ(r.nan_scales.count("bad-global-scale"), 2u) << Codes(r.nan_scales);
  EXPECT_EQ(r.nan_scales.count("bad-input-scale"), 1u) << Codes(r.nan_scales);
  for (const Finding& f : r.nan_scales.kept()) {
    if (f.code == "nan-scale" || f.code == "zero-block-scale") {
      EXPECT_EQ(f.tensor, m);
      EXPECT_EQ(f.row, 3);
      EXPECT_EQ(f.group, f.code == "nan-scale" ? 2 : 4);
    }
  }
  EXPECT_EQ(r.hazards.count("vllm-w13-global-scale-collapse"), 1u) << Codes(r.hazards);
}

TEST(ModelOptPair, ConvertedFixtureIsLosslessAgainstItsMxfp4Source) {
  TempDir dir;
  const PairVerifyResult r = Pair(Fixture("mini-kimi-mxfp4"), Convert(dir));
  EXPECT_TRUE(r.lossless) << Codes(r.mismatches) << r.mismatches.ToJson().dump(1);
  EXPECT_EQ(r.derived_format, "modelopt/nvfp4 (W4A4)");
  EXPECT_EQ(r.derived_kind, "nvfp4");
  EXPECT_EQ(r.quantized_tensors, 96u);
  EXPECT_EQ(r.fused_groups_checked, 32u);
  // Every block in our window; ModelOpt's rule counts the large bytes of the all-zero groups
  // of experts 0, 5, 10 and 15 (docs/tests: tests/data/FIXTURES.md) and loses their tensors.
  ASSERT_EQ(r.windows.size(), 96u);
  uint64_t lossy_tensors = 0;
  for (const PairWindowCount& w : r.windows) {
    EXPECT_EQ(w.lossless_window, w.blocks) << w.tensor;
    const bool marked = w.tensor.find("experts.0.") != std::string::npos ||
                        w.tensor.find("experts.5.") != std::string::npos ||
                        w.tensor.find("experts.10.") != std::string::npos ||
                        w.tensor.find("experts.15.") != std::string::npos;
    if (w.modelopt_rule < w.blocks) ++lossy_tensors;
    EXPECT_EQ(w.modelopt_rule < w.blocks, marked) << w.tensor;
    if (marked) EXPECT_EQ(w.k_max_modelopt, 123) << w.tensor;
  }
  EXPECT_EQ(lossy_tensors, 2u * 4 * 3);
  EXPECT_EQ(r.hazards.count("zero-group-scale-sets-kmax"), 2u * 4 * 3) << Codes(r.hazards);
  EXPECT_EQ(r.hazards.count("modelopt-kmax-lossy-blocks"), 2u * 4 * 3) << Codes(r.hazards);
  EXPECT_EQ(r.hazards.total(), 2u * 2 * 4 * 3) << Codes(r.hazards);
}

// An exclude pattern that matches nothing (an export still listing a module it lacks, as a
// gpt-oss export without lm_head lists lm_head) is a warning: the pair stays lossless, and
// verify-pair and the record say so without failing.
TEST(ModelOptPair, StaleExcludePatternIsAWarningNotAMismatch) {
  TempDir dir;
  const fs::path derived = Convert(dir);
  for (const char* f : {"config.json", "hf_quant_config.json"}) {
    EditJson(derived / f, [](json& c) {
      json& list = c.contains("quantization") ? c["quantization"]["exclude_modules"]
                                              : c["quantization_config"]["ignore"];
      list.push_back("*vision_tower*");  // this export has none
    });
  }
  const PairVerifyResult r = Pair(Fixture("mini-kimi-mxfp4"), derived);
  EXPECT_TRUE(r.lossless) << Codes(r.mismatches);
  EXPECT_EQ(r.mismatches.total(), 0u) << Codes(r.mismatches);
  EXPECT_EQ(r.warnings.count("derived:exclude-matches-nothing"), 1u) << Codes(r.warnings);

  ::ckpt::testing::CliResult cli =
      ::ckpt::testing::RunCli("verify-pair --json --source " + Fixture("mini-kimi-mxfp4").string() +
                                  " --derived " + derived.string(),
                              dir.path());
  EXPECT_EQ(cli.rc, 0) << cli.err << cli.out;
  const json j = json::parse(cli.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << cli.out;
  EXPECT_EQ(j["verdict"], "lossless");
  EXPECT_EQ(j["warnings"]["by_code"]["derived:exclude-matches-nothing"], 1);
  EXPECT_EQ(j["mismatches"]["total"], 0);

  const std::string env = "XDG_DATA_HOME='" + (dir / "xdg").string() + "'";
  const std::string db = " --db " + (dir / "log.db").string();
  ::ckpt::testing::CliResult audited = ::ckpt::testing::RunCli(
      "audit --source " + Fixture("mini-kimi-mxfp4").string() + " " + derived.string() + db,
      dir.path(), env);
  EXPECT_EQ(audited.rc, 0) << audited.err << audited.out;
  ::ckpt::testing::CliResult report =
      ::ckpt::testing::RunCli("report 0 --format json" + db, dir.path(), env);
  ASSERT_EQ(report.rc, 0) << report.err;
  const json predicate = json::parse(report.out)["statement"]["predicate"];
  EXPECT_EQ(predicate["pair_audit"]["warnings"]["total"], 1);
  for (const json& c : predicate["checks"]) {
    if (c["name"] != "pair_verify") continue;
    EXPECT_EQ(c["verdict"], "pass");
    EXPECT_EQ(c["counts"]["warnings"], 1);
    ASSERT_EQ(c["findings"].size(), 1u);
    EXPECT_EQ(c["findings"][0]["code"], "derived:exclude-matches-nothing");
    EXPECT_EQ(c["findings"][0]["fails"], false);
  }
}

// One active w1 group of expert 3 with a large byte (w1's k_max under ModelOpt's rule is no
// longer w3's) and the derived w3 global doubled (the globals no longer agree): the cast did
// not share k_max. Different k_max under globals that agree is not this hazard.
TEST(ModelOptPair, FusedKmaxNotSharedIsAHazard) {
  TempDir dir;
  const fs::path src = CopyFixture("mini-kimi-mxfp4", dir);
  MutateTensor(src, kExpert + "3.w1.weight_packed", [](uint8_t* p, size_t) { p[0] |= 0x01; });
  MutateTensor(src, kExpert + "3.w1.weight_scale", [](uint8_t* p, size_t) { p[0] = 200; });
  const fs::path dst = Convert(dir);
  EXPECT_EQ(Pair(src, dst).hazards.count("fused-kmax-not-shared"), 0u);
  SetF32(dst, kExpert + "3.w3.weight_scale_2", 2.0f);
  const PairVerifyResult r = Pair(src, dst);
  ASSERT_EQ(r.hazards.count("fused-kmax-not-shared"), 1u) << Codes(r.hazards);
  for (const Finding& f : r.hazards.kept()) {
    if (f.code == "fused-kmax-not-shared") EXPECT_EQ(f.tensor, kExpert + "3.w13");
  }
  EXPECT_FALSE(r.lossless);  // the source changed under an unchanged derived
}

TEST(ModelOptPair, MismatchNamesTensorRowAndBlock) {
  TempDir dir;
  const fs::path root = Convert(dir);
  const std::string m = kExpert + "6.w2";  // [128, 192]: 96 packed bytes, 12 blocks a row
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[17 * 12 + 9] += 8; });
  const PairVerifyResult r = Pair(Fixture("mini-kimi-mxfp4"), root);
  EXPECT_FALSE(r.lossless);
  ASSERT_EQ(r.mismatches.count("value-differs"), 1u) << Codes(r.mismatches);
  const Finding& f = r.mismatches.kept()[0];
  EXPECT_EQ(f.tensor, m);
  EXPECT_EQ(f.row, 17);
  EXPECT_EQ(f.group, 4);  // MXFP4 group 4 holds NVFP4 blocks 8 and 9
}

TEST(ModelOptPair, ModelOptStyleCastOfLargeZeroGroupBytesIsLossyWithNamedBlocks) {
  TempDir dir;
  const fs::path dst = dir / "cast";
  ASSERT_TRUE(WriteModelOptCastOfMxfp4(Fixture("mini-kimi-mxfp4"), dst).ok());
  EXPECT_EQ(Detect(dst).findings.total(), 0u) << Codes(Detect(dst).findings);
  const PairVerifyResult r = Pair(Fixture("mini-kimi-mxfp4"), dst);
  EXPECT_FALSE(r.lossless);
  EXPECT_GT(r.mismatches.count("value-differs"), 0u) << Codes(r.mismatches);
  for (const Finding& f : r.mismatches.kept()) {
    EXPECT_TRUE(f.tensor.find("experts.0.") != std::string::npos ||
                f.tensor.find("experts.5.") != std::string::npos ||
                f.tensor.find("experts.10.") != std::string::npos ||
                f.tensor.find("experts.15.") != std::string::npos)
        << f.ToText();
    EXPECT_GE(f.row, 0);
    EXPECT_GE(f.group, 0);
  }
}

}  // namespace
}  // namespace ckpt::quant
