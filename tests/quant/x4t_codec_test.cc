// The X4T scale codec: round trips, the worked layout, canonical-form rejection, and the
// fixture container decoding to exactly the source scale planes.
#include "core/quant/x4t_codec.h"

#include <random>

#include "core/checkpoint.h"
#include "core/quant/quant_weight.h"
#include "core/quant/x4t_container.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

using ::ckpt::testing::Fixture;

std::vector<uint8_t> RandomPlane(uint32_t rows, uint32_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> p(rows * cols);
  for (auto& b : p) {
    uint32_t x = rng() % 10;
    b = x < 8 ? 120 + (x & 1) : static_cast<uint8_t>(rng());  // mostly an adjacent pair
  }
  return p;
}

TEST(X4TCodec, RoundTripsRandomPlanes) {
  for (uint32_t cols : {1u, 7u, 8u, 9u, 96u, 255u}) {
    std::vector<uint8_t> plane = RandomPlane(32, cols, cols);
    auto enc = EncodeX4TScalePlane(plane, 32, cols);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->fixed.size(), X4TFixedStreamBytes(32, cols));
    auto dec = DecodeX4TScalePlane(enc->fixed, enc->exceptions, 32, cols);
    ASSERT_TRUE(dec.ok()) << dec.status();
    EXPECT_EQ(*dec, plane);
  }
}

TEST(X4TCodec, WorkedLayout) {
  // 16 rows x 3 cols; row 0 = {5, 6, 9}: base 5, selectors 0b010, exception (col 2, 9).
  std::vector<uint8_t> plane(48, 7);
  plane[0] = 5, plane[1] = 6, plane[2] = 9;
  auto enc = EncodeX4TScalePlane(plane, 16, 3);
  ASSERT_TRUE(enc.ok());
  ASSERT_EQ(enc->fixed.size(), 32u);
  EXPECT_EQ(enc->fixed[0], 5);
  EXPECT_EQ(enc->fixed[1], 6);  // rows of all 7s: lowest b with count(b)+count(b+1) max is 6
  EXPECT_EQ(enc->fixed[16], 0b010);
  EXPECT_EQ(enc->fixed[17], 0b111);
  EXPECT_EQ(enc->exceptions, (std::vector<uint8_t>{2, 0, 0, 9}));
}

TEST(X4TCodec, RejectsNonCanonicalAndMalformedStreams) {
  std::vector<uint8_t> plane = RandomPlane(16, 9, 3);
  auto enc = EncodeX4TScalePlane(plane, 16, 9);
  ASSERT_TRUE(enc.ok());
  X4TScalePlane bad = *enc;
  bad.fixed[16 + 1] |= 0x80;  // a padding bit of row 0's selector bytes
  EXPECT_EQ(DecodeX4TScalePlane(bad.fixed, bad.exceptions, 16, 9).status().code(),
            absl::StatusCode::kDataLoss);
  ASSERT_GE(enc->exceptions.size(), 8u);
  bad = *enc;
  std::swap_ranges(bad.exceptions.begin(), bad.exceptions.begin() + 4, bad.exceptions.begin() + 4);
  EXPECT_EQ(DecodeX4TScalePlane(bad.fixed, bad.exceptions, 16, 9).status().code(),
            absl::StatusCode::kDataLoss);
  bad = *enc;
  bad.fixed.pop_back();
  EXPECT_EQ(DecodeX4TScalePlane(bad.fixed, bad.exceptions, 16, 9).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(EncodeX4TScalePlane(plane, 8, 18).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(X4TCodec, RejectsAnExceptionThePairCouldExpress) {
  std::vector<uint8_t> plane(16 * 4, 100);
  auto enc = EncodeX4TScalePlane(plane, 16, 4);
  ASSERT_TRUE(enc.ok());
  ASSERT_TRUE(enc->exceptions.empty());
  // Position 1 overwritten with 100 = its own base: decodes to the same plane, not canonical.
  std::vector<uint8_t> exc = {1, 0, 0, 100};
  EXPECT_EQ(DecodeX4TScalePlane(enc->fixed, exc, 16, 4).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(X4TContainer, FixtureDecodesToSourceScales) {
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto x4t = Checkpoint::Open(Fixture("mini-kimi-x4t").string());
  ASSERT_TRUE(src.ok() && x4t.ok());
  std::vector<std::string> modules = PackedModules(**x4t);
  ASSERT_EQ(modules.size(), 2u * 16 * 3);
  for (const std::string& m : modules) {
    auto mat = ReadX4TExpertMatrix(**x4t, m);
    ASSERT_TRUE(mat.ok()) << mat.status();
    auto scale = (*src)->Find(m + ".weight_scale");
    auto packed = (*src)->Find(m + ".weight_packed");
    ASSERT_TRUE(scale && packed) << m;
    EXPECT_TRUE(std::equal(mat->weight_scale.begin(), mat->weight_scale.end(),
                           scale->bytes().begin(), scale->bytes().end())) << m;
    EXPECT_TRUE(std::equal(mat->weight_packed.begin(), mat->weight_packed.end(),
                           packed->bytes().begin(), packed->bytes().end())) << m;
  }
}

TEST(X4TContainer, GroupMajorPermutationRoundTrips) {
  std::vector<uint8_t> src(5 * 3 * 16);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint8_t> stored = PermuteGroupMajor(src, 5, 3);
  EXPECT_EQ(stored[(2 * 5 + 1) * 16 + 4], src[(1 * 3 + 2) * 16 + 4]);  // stored[g=2, r=1, k=4]
  EXPECT_EQ(UnpermuteGroupMajor(stored, 5, 3), src);
}

}  // namespace
}  // namespace ckpt::quant
