// The lossless gpt-oss cast (core/quant/gpt_oss_cast.h): its output for the fixture is the
// committed ModelOpt export (checked by GptOssFixture.CommittedFilesAreWhatTheGeneratorWrites,
// which writes through it, and verified by GptOssPair); here, what it refuses and its counts.
#include "core/quant/gpt_oss_cast.h"

#include <vector>

#include "core/quant/codecs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::quant::gptoss {
namespace {

using ::testing::HasSubstr;

// E 2, H 32, I 32: gate_up [2, 64, 1, 16], every group active with k = -3 (byte 124) except
// expert 1, fused row 5 (up row 2), which the tests set.
struct Tensor {
  Dims d{2, 32, 32};
  std::vector<uint8_t> blocks = std::vector<uint8_t>(2 * 64 * 16, 0x21);
  std::vector<uint8_t> scales = std::vector<uint8_t>(2 * 64, 124);
  absl::StatusOr<ModelOptFused> Cast() {
    return CastToModelOpt("experts.gate_up_proj", d, Fused::kGateUp, blocks, scales);
  }
};

TEST(GptOssCast, OneGlobalFromTheActiveGroupsAndCopiedCodes) {
  Tensor t;
  t.scales[64 + 5] = 250;  // an all-zero group's large byte does not count
  for (int i = 0; i < 16; ++i) t.blocks[(64 + 5) * 16 + i] = 0x88;
  absl::StatusOr<ModelOptFused> x = t.Cast();
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->k_max, -3);
  EXPECT_EQ(x->weight_scale_2, std::ldexp(1.0f, -11));
  EXPECT_EQ(x->zero_groups, 1u);
  // Expert 1, fused row 5, columns 0-15: scale [E, 2, 64] at (1*2 + 0)*64 + 5 = 133, +0; the
  // same row's neighbour (fused row 4) has E4M3 2^8 = 0x78.
  EXPECT_EQ(x->scales[133], 0);
  EXPECT_EQ(x->scales[132], 0x78);
  // Codes [E, 16, 64]: expert 1, byte column 3, fused row 5 -> (16 + 3)*64 + 5.
  EXPECT_EQ(x->packed[(16 + 3) * 64 + 5], 0x88);
  EXPECT_EQ(x->packed[(16 + 3) * 64 + 4], 0x21);
}

TEST(GptOssCast, RefusesAGroupOutsideTheWindowOrWithANanScale) {
  Tensor t;
  t.scales[64 + 5] = 124 - 18;
  absl::StatusOr<ModelOptFused> x = t.Cast();
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(x.status().message(), HasSubstr("expert 1, up row 2, block 0: scale byte 106"));
  t.scales[64 + 5] = 124 - 17;  // the edge of the window is exact: E4M3 2^-9
  ASSERT_TRUE(t.Cast().ok());
  EXPECT_EQ(t.Cast()->scales[133], 0x01);
  t.scales[64 + 5] = kE8M0NaN;
  EXPECT_EQ(t.Cast().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GptOssCast, SizesMustFitTheGeometry) {
  Tensor t;
  auto c = ModelOptCaster::Make("experts.gate_up_proj", t.d, Fused::kGateUp, t.blocks, t.scales);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<uint8_t> packed(c->expert_packed_bytes()), scales(c->expert_scale_bytes());
  EXPECT_EQ(packed.size(), 16u * 64);  // [C/2, R] of one expert
  EXPECT_TRUE(c->CastExpert(1, packed, scales).ok());
  // An expert past E, or buffers of another size, are refused, never written past.
  EXPECT_EQ(c->CastExpert(2, packed, scales).status().code(), absl::StatusCode::kInvalidArgument);
  packed.pop_back();
  EXPECT_EQ(c->CastExpert(0, packed, scales).status().code(), absl::StatusCode::kInvalidArgument);
  t.scales.pop_back();
  EXPECT_EQ(t.Cast().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::quant::gptoss
