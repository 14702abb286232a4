// Catalogued rules (docs/rules.md) that no other test triggered: each mutation of a copied
// fixture gives its named finding, and the clean fixture gives none.
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "core/quant/pair_verify.h"
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
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::quant::testing::WriteCheckpointFrom;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using nlohmann::json;

// Applies `edit` to both quantization_config copies of a Kimi config (top level and nested).
void EditQuantConfig(const fs::path& file, const std::function<void(json&)>& edit) {
  EditJson(file, [&](json& c) {
    edit(c["quantization_config"]);
    edit(c["text_config"]["quantization_config"]);
  });
}

// Rewrites, in the shard header that holds `tensor`, the first `from` inside that tensor's entry
// with `to` (same length, so every offset stays valid): a dtype or a name changed on disk.
void EditHeaderEntry(const fs::path& root, const std::string& tensor, const std::string& from,
                     const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  fs::path shard;
  {
    auto ckpt = Checkpoint::Open(root.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto ref = (*ckpt)->Find(tensor);
    ASSERT_TRUE(ref.has_value()) << tensor;
    shard = ref->file->path();
  }
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  std::string s(bytes.begin(), bytes.end());
  const size_t entry = s.find("\"" + tensor + "\":{");
  ASSERT_NE(entry, std::string::npos) << tensor;
  const size_t at = s.find(from, entry + tensor.size() + 2);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  ::ckpt::testing::WriteAll(shard, s);
}

// A copy of mini-kimi-mxfp4 with its quantization_config edited.
class Mxfp4Config : public ::testing::Test {
 protected:
  FormatReport DetectEdited(const std::function<void(json&)>& edit) {
    root_ = CopyFixture("mini-kimi-mxfp4", dir_);
    EditQuantConfig(root_ / "config.json", edit);
    return Detect(root_);
  }
  TempDir dir_;
  fs::path root_;
};

TEST_F(Mxfp4Config, CleanFixtureHasNoFindings) {
  EXPECT_EQ(Detect(Fixture("mini-kimi-mxfp4")).findings.total(), 0u);
}

TEST_F(Mxfp4Config, IgnoreEntryThatIsNotARegexIsBadPattern) {
  FormatReport r = DetectEdited([](json& q) { q["ignore"].push_back("re:(unclosed"); });
  EXPECT_EQ(r.findings.count("bad-pattern"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.total(), 1u) << Codes(r);
}

TEST_F(Mxfp4Config, WeightsThatAreNot4BitFloatAreAConfigGroupFinding) {
  FormatReport r = DetectEdited(
      [](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; });
  EXPECT_EQ(r.findings.count("config-group"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.total(), 1u) << Codes(r);
}

TEST_F(Mxfp4Config, TargetsMatchingNoQuantizedTensorLeaveEveryOneUntargeted) {
  FormatReport r = DetectEdited(
      [](json& q) { q["config_groups"]["group_0"]["targets"] = {"re:.*no_such_module$"}; });
  EXPECT_EQ(r.findings.count("untargeted-quantized"), 96u) << Codes(r);
}

TEST_F(Mxfp4Config, TargetedDenseModuleIsAnUnquantizedTarget) {
  FormatReport r = DetectEdited([](json& q) {
    q["config_groups"]["group_0"]["targets"].push_back("language_model.model.embed_tokens");
  });
  ASSERT_EQ(r.findings.count("unquantized-target"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.kept()[0].tensor, "language_model.model.embed_tokens.weight");
}

TEST_F(Mxfp4Config, UnknownQuantMethodIsUnsupportedNeverGuessed) {
  FormatReport r = DetectEdited([](json& q) { q["quant_method"] = "bitsandbytes"; });
  EXPECT_EQ(r.format, QuantFormat::kUnknown);
  EXPECT_EQ(r.findings.count("unsupported-format"), 1u) << Codes(r);
}

TEST_F(Mxfp4Config, X4TMethodOnAPlainCheckpointIsALayoutFinding) {
  FormatReport r = DetectEdited([](json& q) { q["quant_method"] = "kimi_x4t"; });
  EXPECT_EQ(r.format, QuantFormat::kX4TContainerB);
  EXPECT_EQ(r.findings.count("layout"), 1u) << Codes(r);
}

TEST(RuleTriggers, PackedTensorsWithoutQuantizationConfigAreUndeclared) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditJson(root / "config.json", [](json& c) {
    c.erase("quantization_config");
    c["text_config"].erase("quantization_config");
  });
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("undeclared-quantization"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.total(), 1u) << Codes(r);
}

TEST(RuleTriggers, X4TVersionRootSchemaAndContractCodecAreChecked) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-x4t", dir);
  EditQuantConfig(root / "metadata/config.json", [](json& q) {
    q["format_version"] = 2;
    q["checkpoint_root"] = "x4t";  // relative
  });
  EditJson(root / "manifest.json",
           [](json& m) { m["schema"] = "trellis-exact-mxfp4-checkpoint/2"; });
  EditJson(root / "build-contract.json", [](json& b) { b["codec"] = "other-codec/1"; });
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("format-version"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("checkpoint-root"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("checkpoint-root-mismatch"), 0u) << Codes(r);
  EXPECT_EQ(r.findings.count("manifest-schema"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("build-contract-codec"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.total(), 4u) << Codes(r);
}

// Row 64 group 1 of layer 1 expert 0's w1 is all zero (scale byte 1): 0xFF there is reported
// but the values are zero, so the verdict stays lossless-transcodable.
// X4T container B (docs/formats.md §6) with its root mapped: clean, then a module whose tensors
// do not resolve (an exceptions stream declared I32) and one whose packed weight is re-declared
// [96, 128] (same bytes), for which the fixed scale stream has the wrong size.
TEST(RuleTriggers, X4TModulesThatDoNotResolveOrWhoseFixedStreamIsMisSizedAreNamed) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-x4t", dir);
  FormatOptions options;
  options.root_map.push_back({"/x4t", root.string()});
  const auto detect = [&] {
    auto c = Checkpoint::Open(root.string());
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? DetectFormat(**c, options) : FormatReport{};
  };
  ASSERT_EQ(detect().findings.total(), 0u) << Codes(detect());
  const std::string exc = kExpert + "4.w3";
  EditHeaderEntry(root, exc + ".weight_scale.exact_mxfp4_exceptions", "\"U32\"", "\"I32\"");
  const std::string odd = kExpert + "0.w1";
  EditHeaderEntry(root, odd + ".weight_packed", "[192,64]", "[96,128]");
  const FormatReport r = detect();
  ASSERT_EQ(r.findings.count("tensor-contract"), 1u) << Codes(r);
  ASSERT_EQ(r.findings.count("x4t-fixed-size"), 1u) << Codes(r);
  for (const Finding& f : r.findings.kept()) {
    if (f.code == "tensor-contract") {
      EXPECT_EQ(f.tensor, exc);
      EXPECT_NE(f.message.find(exc + ".weight_scale.exact_mxfp4_exceptions: I32"),
                std::string::npos) << f.message;
    } else if (f.code == "x4t-fixed-size") {
      EXPECT_EQ(f.tensor, odd + ".weight_scale.exact_mxfp4_fixed");
      EXPECT_EQ(f.message, "384 bytes for a [96, 8] scale plane") << f.message;
    }
  }
}

TEST(RuleTriggers, NaNScaleOnAnAllZeroGroupIsReportedNotRejected) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "0.w1";
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t n) {
    ASSERT_EQ(n, 192u * 4);
    ASSERT_EQ(p[64 * 4 + 1], 1);
    p[64 * 4 + 1] = 0xFF;
  });
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto r = ScaleWindowPolicy(ScaleWindowConfig{}).Check(**ckpt, NoProgress(), 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, ScaleWindowVerdict::kLosslessTranscodable);
  ASSERT_EQ(r->nan_scales.count("nan-scale-zero-group"), 1u);
  EXPECT_EQ(r->nan_scales.count("nan-scale"), 0u);
  EXPECT_EQ(r->nan_scales.kept()[0].tensor, m);
  EXPECT_EQ(r->nan_scales.kept()[0].row, 64);
  EXPECT_EQ(r->nan_scales.kept()[0].group, 1);
}


// Dtypes changed in the header (same sizes): the scale or packed tensor is no longer what its
// format stores.
TEST(RuleTriggers, WrongScaleOrPackedDtypeIsNamed) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditHeaderEntry(root, kExpert + "2.w1.weight_scale", "\"dtype\":\"U8\"", "\"dtype\":\"I8\"");
  EditHeaderEntry(root, kExpert + "3.w2.weight_packed", "\"dtype\":\"U8\"", "\"dtype\":\"I8\"");
  FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("scale-dtype"), 1u) << Codes(r);
  ASSERT_EQ(r.findings.count("packed-shape"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.kept()[0].tensor, kExpert + "2.w1.weight_scale");
  EXPECT_EQ(r.findings.kept()[1].tensor, kExpert + "3.w2.weight_packed");
}

TEST(RuleTriggers, Nvfp4GlobalScaleMissingOrNotF32IsNamed) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-nvfp4", dir);
  EXPECT_EQ(Detect(root).findings.total(), 0u);
  const std::string gone = kExpert + "4.w3.weight_global_scale";
  for (const char* f : {"model-00001-of-00002.safetensors", "model.safetensors.index.json"}) {
    std::vector<uint8_t> b = ::ckpt::testing::ReadAll(root / f);
    std::string s(b.begin(), b.end());
    const size_t at = s.find("\"" + gone + "\"");
    ASSERT_NE(at, std::string::npos) << f;
    s[at + gone.size()] = 'X';  // ...weight_global_scalX
    ::ckpt::testing::WriteAll(root / f, s);
  }
  EditHeaderEntry(root, kExpert + "6.w1.weight_global_scale", "\"F32\"", "\"I32\"");
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("missing-global-scale"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("global-scale-shape"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("extra-tensor"), 1u) << Codes(r);  // the renamed one
}


TEST(RuleTriggers, UnreadableX4TSidecarIsNamed) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  ::ckpt::testing::WriteAll(root / "x4t-layer-00001.safetensors", std::string("\x10\0\0", 3));
  FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("sidecar-unreadable"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.kept()[0].tensor, "x4t-layer-00001.safetensors");
}


// Expert 0's w1 re-declared [96, 256] in the derived header (same bytes): a pair mismatch.
TEST(RuleTriggers, DerivedMatrixOfAnotherShapeIsShapeDiffers) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-kimi-nvfp4", dir);
  const std::string m = kExpert + "0.w1";
  EditHeaderEntry(root, m + ".weight_packed", "[192,64]", "[96,128]");
  EditHeaderEntry(root, m + ".weight_scale", "[192,8]", "[96,16]");
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto dst = Checkpoint::Open(root.string());
  ASSERT_TRUE(src.ok() && dst.ok());
  auto r = VerifyPair(**src, **dst, PairVerifyOptions{}, NoProgress());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->lossless);
  ASSERT_EQ(r->mismatches.count("shape-differs"), 1u) << r->mismatches.ToJson().dump();
}

// Doubles the F32 scalar `tensor` of the checkpoint at `root`.
void DoubleF32(const fs::path& root, const std::string& tensor) {
  MutateTensor(root, tensor, [](uint8_t* p, size_t n) {
    ASSERT_EQ(n, 4u);
    float g;
    std::memcpy(&g, p, 4);
    g *= 2;
    std::memcpy(p, &g, 4);
  });
}

// A dense fused linear stored NVFP4 (docs/formats.md §5): layer 0's MLP gate_proj and up_proj
// are expert 0's w1 and w3, nothing else. With equal globals there is no hazard; with up_proj's
// doubled vLLM would load both with the larger one, which it calls out by the fused group.
TEST(RuleTriggers, DenseGateUpWithDifferentGlobalsIsTheFusedMaxHazard) {
  const std::string mlp = "language_model.model.layers.0.mlp.";
  const auto rename = [&](const std::string& n) -> std::string {
    using P = std::pair<std::string, std::string>;
    for (const auto& [from, to] :
         {P{kExpert + "0.w1.", "gate_proj."}, P{kExpert + "0.w3.", "up_proj."}}) {
      if (absl::StartsWith(n, from)) return mlp + to + n.substr(from.size());
    }
    return "";
  };
  const auto hazards = [](const fs::path& root) {
    auto c = Checkpoint::Open(root.string());
    EXPECT_TRUE(c.ok()) << c.status();
    auto r = ScaleWindowPolicy().Check(**c, NoProgress(), 2);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->hazards : FindingList();
  };
  TempDir dir;
  const fs::path root = dir / "dense-nvfp4";
  WriteCheckpointFrom(Fixture("mini-kimi-nvfp4"), root, rename);
  EXPECT_EQ(hazards(root).total(), 0u) << hazards(root).ToJson().dump();
  DoubleF32(root, mlp + "up_proj.weight_global_scale");
  const FindingList h = hazards(root);
  ASSERT_EQ(h.count("vllm-fused-global-scale-max"), 1u) << h.ToJson().dump();
  EXPECT_EQ(h.count("vllm-w13-global-scale-collapse"), 0u);
  EXPECT_EQ(h.kept()[0].tensor, mlp + "gate_up");
}

// Expert 0's w1/w3 under DeepSeek-style names (experts.0.gate_proj / up_proj), up's global
// doubled: a routed expert's gate/up is vLLM's fused-MoE w13, which loads both with gate's
// global (docs/formats.md §9.5), not the max a dense gate/up linear takes.
TEST(RuleTriggers, ExpertGateUpWithDifferentGlobalsIsTheW13Collapse) {
  const std::string e0 = kExpert + "0.";
  TempDir dir;
  const fs::path root = dir / "expert-gate-up";
  WriteCheckpointFrom(Fixture("mini-kimi-nvfp4"), root, [&](const std::string& n) -> std::string {
    if (absl::StartsWith(n, e0 + "w1.")) return e0 + "gate_proj." + n.substr(e0.size() + 3);
    if (absl::StartsWith(n, e0 + "w3.")) return e0 + "up_proj." + n.substr(e0.size() + 3);
    return "";
  });
  DoubleF32(root, e0 + "up_proj.weight_global_scale");
  auto c = Checkpoint::Open(root.string());
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = ScaleWindowPolicy().Check(**c, NoProgress(), 2);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->hazards.count("vllm-w13-global-scale-collapse"), 1u) << r->hazards.ToJson().dump();
  EXPECT_EQ(r->hazards.count("vllm-fused-global-scale-max"), 0u);
  EXPECT_EQ(r->hazards.kept()[0].tensor, e0 + "w13");
}

// A compressed-tensors NVFP4 derived checkpoint in which one module was left MXFP4 (the
// source's tensors for expert 3's w1): its pair unit names the module and the kind.
TEST(RuleTriggers, DerivedModuleLeftMxfp4IsADerivedKindMismatch) {
  const std::string m = kExpert + "3.w1";
  TempDir dir;
  const fs::path root = dir / "partly-nvfp4";
  auto mx = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(mx.ok());
  std::vector<TensorToWrite> left;
  for (const char* suffix : {".weight_packed", ".weight_scale"}) {
    const TensorRef t = *(*mx)->Find(m + suffix);
    left.push_back(TensorToWrite::Borrowed(*t.info, t.bytes()));
  }
  WriteCheckpointFrom(Fixture("mini-kimi-nvfp4"), root,
            [&](const std::string& n) { return absl::StartsWith(n, m + ".") ? "" : n; },
            std::move(left));
  auto dst = Checkpoint::Open(root.string());
  ASSERT_TRUE(dst.ok()) << dst.status();
  auto r = VerifyPair(**mx, **dst, PairVerifyOptions{}, NoProgress());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->lossless);
  ASSERT_EQ(r->mismatches.count("derived-kind"), 1u) << r->mismatches.ToJson().dump();
  for (const Finding& f : r->mismatches.kept()) {
    if (f.code != "derived-kind") continue;
    EXPECT_EQ(f.tensor, m);
    EXPECT_EQ(f.message, "derived weight is mxfp4, not NVFP4 or X4T");
  }
  // The clean pair has no mismatch at all.
  auto clean = Checkpoint::Open(Fixture("mini-kimi-nvfp4").string());
  ASSERT_TRUE(clean.ok());
  auto ok = VerifyPair(**mx, **clean, PairVerifyOptions{}, NoProgress());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->lossless);
  EXPECT_EQ(ok->mismatches.total(), 0u) << ok->mismatches.ToJson().dump();
}

}  // namespace
}  // namespace ckpt::quant
