// Dequantization against tests/data/oracle: every routed-expert digest must match for the
// MXFP4 source, its NVFP4 transcode and the X4T container; full values for layer 1 experts 0-3.
#include <cstring>

#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/quant/dequant.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

using ::ckpt::testing::Fixture;

std::string ModuleOf(const std::string& key) {  // "1.0.w1"
  std::vector<std::string> p = absl::StrSplit(key, '.');
  return "language_model.model.layers." + p[0] + ".block_sparse_moe.experts." + p[1] + "." + p[2];
}

nlohmann::json LoadOracleDigests() {
  auto j = ReadJsonFile(Fixture("oracle/mini-kimi-dequant-sha256.json").string());
  EXPECT_TRUE(j.ok());
  return j->at("digests");
}

class OracleDigests : public ::testing::TestWithParam<const char*> {};

TEST_P(OracleDigests, EveryRoutedExpertMatches) {
  auto ckpt = Checkpoint::Open(Fixture(GetParam()).string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  nlohmann::json digests = LoadOracleDigests();
  ASSERT_EQ(digests.size(), 96u);
  for (const auto& [key, hex] : digests.items()) {
    std::array<uint64_t, 2> shape;
    auto v = DequantizeWeight(**ckpt, ModuleOf(key), &shape);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(shape[0] * shape[1], v->size());
    EXPECT_EQ(ToHex(Sha256Of(Float32Bytes(*v))), hex.get<std::string>()) << GetParam() << " " << key;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OracleDigests,
                         ::testing::Values("mini-kimi-mxfp4", "mini-kimi-nvfp4", "mini-kimi-x4t"));

TEST(Dequant, FullValuesMatchOracleFile) {
  auto ckpt = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto oracle = SafetensorsFile::Open(Fixture("oracle/mini-kimi-dequant-L1-e0-3.safetensors").string());
  ASSERT_TRUE(ckpt.ok() && oracle.ok());
  ASSERT_EQ((*oracle)->tensors().size(), 12u);
  for (const TensorInfo& t : (*oracle)->tensors()) {
    auto v = DequantizeWeight(**ckpt, ModuleOf(t.name));
    ASSERT_TRUE(v.ok()) << v.status();
    auto bytes = (*oracle)->Bytes(t);
    ASSERT_EQ(bytes.size(), v->size() * 4);
    for (size_t i = 0; i < v->size(); ++i) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      ASSERT_EQ(static_cast<float>((*v)[i]), f) << t.name << " element " << i;
    }
  }
}

TEST(Dequant, HighNibbleFirstOrderDoesNotReproduceTheOracle) {
  auto ckpt = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(ckpt.ok());
  const std::string m = ModuleOf("1.0.w1");
  auto w = ResolveWeight(**ckpt, m);
  ASSERT_TRUE(w.ok());
  auto hi = Mxfp4View::Make(m, w->packed.bytes(), w->scale.bytes(), w->rows, w->cols,
                            NibbleOrder::kHighFirst);
  ASSERT_TRUE(hi.ok());
  std::vector<double> v(w->rows * w->cols);
  for (uint64_t r = 0; r < w->rows; ++r)
    for (uint64_t c = 0; c < w->cols; ++c) v[r * w->cols + c] = hi->Value(r, c);
  EXPECT_NE(ToHex(Sha256Of(Float32Bytes(v))), LoadOracleDigests()["1.0.w1"]);
}

TEST(Dequant, PlainBf16WeightAndErrors) {
  auto ckpt = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(ckpt.ok());
  std::array<uint64_t, 2> shape;
  auto v = DequantizeWeight(**ckpt, "language_model.model.layers.0.mlp.down_proj", &shape);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(shape, (std::array<uint64_t, 2>{256, 384}));
  auto t = (*ckpt)->Find("language_model.model.layers.0.mlp.down_proj.weight");
  uint16_t b;
  std::memcpy(&b, t->bytes().data() + 2 * 5, 2);
  EXPECT_EQ((*v)[5], DecodeBF16(b));
  EXPECT_EQ(DequantizeWeight(**ckpt, "no.such.module").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::quant
