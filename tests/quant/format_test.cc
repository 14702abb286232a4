// Format detection and contract checks: the fixtures are clean; each mutation of a copied
// config or inventory gives its named finding.
#include "core/quant/format.h"

#include <filesystem>

#include "core/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::Codes;
using ::ckpt::quant::testing::Detect;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using nlohmann::json;

// Applies `edit` to both quantization_config copies (top level and text_config).
void EditConfig(const fs::path& file, const std::function<void(json&)>& edit) {
  auto j = ReadJsonFile(file.string());
  ASSERT_TRUE(j.ok());
  edit((*j)["quantization_config"]);
  edit((*j)["text_config"]["quantization_config"]);
  ::ckpt::testing::WriteAll(file, j->dump(2));
}

TEST(Format, DetectsTheFixtures) {
  FormatReport mx = Detect(Fixture("mini-kimi-mxfp4"));
  EXPECT_EQ(mx.format, QuantFormat::kCompressedTensorsMxfp4);
  EXPECT_EQ(mx.group_size, 32);
  EXPECT_EQ(mx.quantized_modules, 96u);
  EXPECT_EQ(mx.findings.total(), 0u) << Codes(mx);

  FormatReport nv = Detect(Fixture("mini-kimi-nvfp4"));
  EXPECT_EQ(nv.format, QuantFormat::kCompressedTensorsNvfp4);
  EXPECT_EQ(nv.activations, "A16");
  EXPECT_EQ(nv.Describe(), "compressed-tensors/nvfp4-pack-quantized (W4A16)");
  EXPECT_EQ(nv.findings.total(), 0u) << Codes(nv);
}

TEST(Format, X4TCheckpointRootMustBeTheMountedRootUnlessMapped) {
  FormatReport unmapped = Detect(Fixture("mini-kimi-x4t"));
  EXPECT_EQ(unmapped.format, QuantFormat::kX4TContainerB);
  EXPECT_EQ(unmapped.findings.total(), 1u) << Codes(unmapped);
  EXPECT_EQ(unmapped.findings.count("checkpoint-root-mismatch"), 1u);
  auto map = ParseRootMapping("/x4t=" + Fixture("mini-kimi-x4t").string());
  ASSERT_TRUE(map.ok());
  FormatOptions options;
  options.root_map.push_back(*map);
  FormatReport mapped = Detect(Fixture("mini-kimi-x4t"), options);
  EXPECT_EQ(mapped.findings.total(), 0u) << Codes(mapped);
  EXPECT_EQ(mapped.quantized_modules, 96u);
  EXPECT_FALSE(ParseRootMapping("x4t=/a").ok());
  EXPECT_FALSE(ParseRootMapping("/x4t").ok());
}

TEST(Format, X4TManifestAndNestedConfigAreChecked) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-x4t", dir);
  auto cfg = ReadJsonFile((root / "metadata/config.json").string());
  (*cfg)["text_config"].erase("quantization_config");  // Kimi must nest it
  ::ckpt::testing::WriteAll(root / "metadata/config.json", cfg->dump(2));
  auto mf = ReadJsonFile((root / "manifest.json").string());
  (*mf)["codec"] = "adjacent-pair-fixed-stream-u24-exceptions/2";
  (*mf)["family"] = "deepseek_v41";
  ::ckpt::testing::WriteAll(root / "manifest.json", mf->dump(1));
  FormatOptions options;
  options.root_map.push_back({"/x4t", root.string()});
  FormatReport r = Detect(root, options);
  EXPECT_EQ(r.findings.count("config-disagreement"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("manifest-codec"), 1u);
  EXPECT_EQ(r.findings.count("manifest-family"), 1u);
  EXPECT_EQ(r.findings.count("build-contract-family"), 0u);
  auto bc = ReadJsonFile((root / "build-contract.json").string());
  (*bc)["schema"] = "trellis-exact-mxfp4-checkpoint/2";
  ::ckpt::testing::WriteAll(root / "build-contract.json", bc->dump(1));
  EXPECT_EQ(Detect(root, options).findings.count("build-contract-schema"), 1u);
  EXPECT_EQ(r.findings.count("checkpoint-root-mismatch"), 0u);
}

TEST(Format, ConfigGroupSizeMismatch) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  EditConfig(root / "config.json",
             [](json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 16; });
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("group-size"), 1u) << Codes(r);
}

TEST(Format, IgnoreListCoveringAQuantizedTensor) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  EditConfig(root / "config.json", [](json& q) { q["ignore"].push_back("re:.*experts\\.3\\.w2$"); });
  FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("ignore-covers-quantized"), 2u) << Codes(r);  // layers 1 and 2
  EXPECT_EQ(r.findings.kept()[0].tensor, kExpert + "3.w2");
}

TEST(Format, W4A4NeedsInputGlobalScales) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  EditConfig(root / "config.json", [](json& q) {
    q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 4}, {"type", "float"}};
  });
  FormatReport r = Detect(root);
  EXPECT_EQ(r.activations, "W4A4");
  EXPECT_EQ(r.findings.count("missing-input-global-scale"), 96u) << Codes(r);
}

TEST(Format, GeometryComesFromConfig) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  auto cfg = ReadJsonFile((root / "config.json").string());
  (*cfg)["text_config"]["moe_intermediate_size"] = 3072;
  (*cfg)["text_config"]["n_routed_experts"] = 17;
  ::ckpt::testing::WriteAll(root / "config.json", cfg->dump(2));
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("geometry"), 96u) << Codes(r);
  EXPECT_EQ(r.findings.count("missing-tensor"), 2u * 3);  // expert 16 of layers 1 and 2
}

TEST(Format, MissingScaleAndExtraTensor) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  // Rename expert 5's w1 scale to "...w1.weight" in the shard header and index: the packed
  // tensor loses its scale, and the module gains a tensor its format does not have.
  const std::string from = kExpert + "5.w1.weight_scale", to = kExpert + "5.w1.weight_scalX";
  for (const char* f : {"model-00001-of-00002.safetensors", "model.safetensors.index.json"}) {
    std::vector<uint8_t> b = ::ckpt::testing::ReadAll(root / f);
    std::string s(b.begin(), b.end());
    const size_t at = s.find("\"" + from + "\"");
    ASSERT_NE(at, std::string::npos);
    s.replace(at + 1, from.size(), to);
    ::ckpt::testing::WriteAll(root / f, s);
  }
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("missing-scale"), 1u) << Codes(r);
  EXPECT_EQ(r.findings.count("extra-tensor"), 1u) << Codes(r);
}

}  // namespace
}  // namespace ckpt::quant
