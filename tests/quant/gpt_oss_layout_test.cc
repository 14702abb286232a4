// The gpt-oss index maps (docs/quant.md "gpt-oss layouts"): positions computed by hand for a
// geometry where every axis has its own length (E 3, H 96, I 64, so 2I 128), so a swapped axis
// cannot give the same index; and both maps are bijections onto the tensors' nibbles.
#include "core/quant/gpt_oss_layout.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::quant::gptoss {
namespace {

using ::testing::HasSubstr;

const Dims kDims{3, 96, 64};

TEST(GptOssLayoutTest, GateAndUpInterleaveOnTheFusedRows) {
  EXPECT_EQ(ToFused(Projection::kGate, 2, 5, 37).row, 10u);
  EXPECT_EQ(ToFused(Projection::kUp, 2, 5, 37).row, 11u);
  EXPECT_EQ(ToFused(Projection::kDown, 1, 7, 40).row, 7u);
  EXPECT_EQ(ProjectionOfRow(Fused::kGateUp, 10), Projection::kGate);
  EXPECT_EQ(ProjectionOfRow(Fused::kGateUp, 11), Projection::kUp);
  EXPECT_EQ(ProjectionOfRow(Fused::kDown, 11), Projection::kDown);
  EXPECT_EQ(ProjectionRow(Fused::kGateUp, 11), 5u);
  EXPECT_EQ(ProjectionRow(Fused::kDown, 11), 11u);
}

TEST(GptOssLayoutTest, Mxfp4PositionsByHand) {
  // gate row 5 of expert 2, column 37: fused row 10, [E, 128, 3, 16] -> row 2*128+10 = 266,
  // byte 266*48 + 37/2 = 12786, odd column = high nibble; scale 266*3 + 37/32 = 799.
  EXPECT_EQ(Mxfp4Position(kDims, Fused::kGateUp, ToFused(Projection::kGate, 2, 5, 37)),
            (ElementAt{{12786, true}, 799}));
  // up row 5, column 36: fused row 11 -> 267*48 + 18 = 12834, low; 267*3 + 1 = 802.
  EXPECT_EQ(Mxfp4Position(kDims, Fused::kGateUp, ToFused(Projection::kUp, 2, 5, 36)),
            (ElementAt{{12834, false}, 802}));
  // down row 7 of expert 1, column 40: [E, 96, 2, 16] -> row 96+7 = 103, byte 103*32 + 20 =
  // 3316, low; scale 103*2 + 1 = 207.
  EXPECT_EQ(Mxfp4Position(kDims, Fused::kDown, ToFused(Projection::kDown, 1, 7, 40)),
            (ElementAt{{3316, false}, 207}));
}

TEST(GptOssLayoutTest, ModelOptPositionsByHand) {
  // gate_up_proj [E, H/2 = 48, 128]: byte (2*48 + 18)*128 + 10 = 14602, high;
  // weight_scale [E, H/16 = 6, 128]: (2*6 + 37/16)*128 + 10 = 1802.
  EXPECT_EQ(ModelOptPosition(kDims, Fused::kGateUp, ToFused(Projection::kGate, 2, 5, 37)),
            (ElementAt{{14602, true}, 1802}));
  EXPECT_EQ(ModelOptPosition(kDims, Fused::kGateUp, ToFused(Projection::kUp, 2, 5, 36)),
            (ElementAt{{14603, false}, 1803}));
  // down_proj [E, I/2 = 32, 96]: (32 + 20)*96 + 7 = 4999, low; [E, 4, 96]: (4 + 2)*96 + 7 = 583.
  EXPECT_EQ(ModelOptPosition(kDims, Fused::kDown, ToFused(Projection::kDown, 1, 7, 40)),
            (ElementAt{{4999, false}, 583}));
}

// Every nibble of each tensor is hit exactly once, and every element of one scale group (32
// or 16 consecutive columns of one fused row) maps to the same scale byte.
TEST(GptOssLayoutTest, BothLayoutsAreBijections) {
  for (Fused f : {Fused::kGateUp, Fused::kDown}) {
    const uint64_t R = kDims.Rows(f), C = kDims.Cols(f), n = kDims.experts * R * C;
    std::set<std::pair<uint64_t, bool>> mx, mo;
    for (uint64_t e = 0; e < kDims.experts; ++e) {
      for (uint64_t r = 0; r < R; ++r) {
        for (uint64_t c = 0; c < C; ++c) {
          const ElementAt a = Mxfp4Position(kDims, f, {e, r, c});
          const ElementAt b = ModelOptPosition(kDims, f, {e, r, c});
          ASSERT_LT(a.code.byte, n / 2);
          ASSERT_LT(b.code.byte, n / 2);
          ASSERT_LT(a.scale, n / 32);
          ASSERT_LT(b.scale, n / 16);
          EXPECT_EQ(a.scale, Mxfp4Position(kDims, f, {e, r, c / 32 * 32}).scale);
          EXPECT_EQ(b.scale, ModelOptPosition(kDims, f, {e, r, c / 16 * 16}).scale);
          mx.insert({a.code.byte, a.code.high});
          mo.insert({b.code.byte, b.code.high});
        }
      }
    }
    EXPECT_EQ(mx.size(), n);
    EXPECT_EQ(mo.size(), n);
  }
}

TEST(GptOssLayoutTest, TensorNamesAndShapes) {
  const std::string p = "model.layers.0.mlp.experts.";
  const std::vector<TensorSpec> mx = Mxfp4Tensors(p, kDims, Fused::kGateUp, DType::kBF16);
  ASSERT_EQ(mx.size(), 3u);
  EXPECT_EQ(mx[0].name, p + "gate_up_proj_blocks");
  EXPECT_EQ(mx[0].shape, (std::vector<uint64_t>{3, 128, 3, 16}));
  EXPECT_EQ(mx[1].name, p + "gate_up_proj_scales");
  EXPECT_EQ(mx[1].shape, (std::vector<uint64_t>{3, 128, 3}));
  EXPECT_EQ(mx[2].name, p + "gate_up_proj_bias");
  EXPECT_EQ(mx[2].shape, (std::vector<uint64_t>{3, 128}));
  const std::vector<TensorSpec> mo = ModelOptTensors(p, kDims, Fused::kDown, true, DType::kBF16);
  ASSERT_EQ(mo.size(), 5u);
  EXPECT_EQ(mo[0].name, p + "down_proj");
  EXPECT_EQ(mo[0].dtype, DType::kU8);
  EXPECT_EQ(mo[0].shape, (std::vector<uint64_t>{3, 32, 96}));
  EXPECT_EQ(mo[1].name, p + "down_proj_weight_scale");
  EXPECT_EQ(mo[1].dtype, DType::kF8_E4M3);
  EXPECT_EQ(mo[1].shape, (std::vector<uint64_t>{3, 4, 96}));
  EXPECT_EQ(mo[2].name, p + "down_proj_weight_scale_2");
  EXPECT_TRUE(mo[2].shape.empty());
  EXPECT_EQ(mo[3].name, p + "down_proj_input_scale");
  EXPECT_EQ(mo[4].name, p + "down_proj_bias");
  EXPECT_EQ(ModelOptTensors(p, kDims, Fused::kDown, false, DType::kBF16).size(), 4u);
}

TEST(GptOssLayoutTest, DimsFromConfig) {
  auto d =
      DimsFromConfig({{"num_local_experts", 3}, {"hidden_size", 96}, {"intermediate_size", 64}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->Rows(Fused::kGateUp), 128u);
  EXPECT_EQ(d->Cols(Fused::kDown), 64u);
  EXPECT_THAT(DimsFromConfig({{"num_local_experts", 3}, {"hidden_size", 96}}).status().message(),
              HasSubstr("intermediate_size"));
  EXPECT_THAT(
      DimsFromConfig({{"num_local_experts", 3}, {"hidden_size", 90}, {"intermediate_size", 64}})
          .status()
          .message(),
      HasSubstr("multiples of 32"));
  EXPECT_FALSE(
      DimsFromConfig({{"num_local_experts", -3}, {"hidden_size", 96}, {"intermediate_size", 64}})
          .ok());
  // 2I and the products of the maps must not wrap.
  EXPECT_FALSE(
      DimsFromConfig(
          {{"num_local_experts", 3}, {"hidden_size", 96}, {"intermediate_size", uint64_t{1} << 63}})
          .ok());
}

}  // namespace
}  // namespace ckpt::quant::gptoss
