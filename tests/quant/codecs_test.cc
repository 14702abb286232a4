// Scalar codecs (core/quant/codecs.h) against values worked out from the format definitions.
#include "core/quant/codecs.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ckpt::quant {
namespace {

TEST(E2M1, DecodesEveryCode) {
  const float want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(DecodeE2M1(c), want[c]) << c;
  EXPECT_TRUE(std::signbit(DecodeE2M1(8)));
  EXPECT_FALSE(NibbleIsNonzero(8));
  EXPECT_TRUE(NibbleIsNonzero(9));
}

TEST(E2M1, LowNibbleIsTheEvenElement) {
  EXPECT_EQ(LowNibble(0xA3), 0x3);
  EXPECT_EQ(HighNibble(0xA3), 0xA);
}

TEST(E8M0, PowersOfTwoAndNaN) {
  EXPECT_EQ(DecodeE8M0(127), 1.0);
  EXPECT_EQ(DecodeE8M0(0), std::ldexp(1.0, -127));
  EXPECT_EQ(DecodeE8M0(254), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(DecodeE8M0(0xFF)));
  EXPECT_EQ(E8M0Exponent(120), -7);
}

TEST(E4M3, NormalsSubnormalsAndNaN) {
  EXPECT_EQ(DecodeE4M3(0x38), 1.0);         // exp 7, man 0
  EXPECT_EQ(DecodeE4M3(0x7E), 448.0);       // the maximum
  EXPECT_EQ(DecodeE4M3(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(DecodeE4M3(0x07), 7 * std::ldexp(1.0, -9));
  EXPECT_EQ(DecodeE4M3(0xB8), -1.0);
  EXPECT_TRUE(std::isnan(DecodeE4M3(0x7F)));
  EXPECT_TRUE(std::isnan(DecodeE4M3(0xFF)));
  EXPECT_EQ(DecodeE4M3(0x00), 0.0);
}

TEST(E4M3, PowerOfTwoWindowRoundTrips) {
  for (int k = -9; k <= 8; ++k) {
    int b = EncodeE4M3PowerOfTwo(k);
    ASSERT_GE(b, 0) << k;
    EXPECT_EQ(DecodeE4M3(static_cast<uint8_t>(b)), std::ldexp(1.0, k)) << k;
  }
  EXPECT_EQ(EncodeE4M3PowerOfTwo(-10), -1);
  EXPECT_EQ(EncodeE4M3PowerOfTwo(9), -1);
}

TEST(BF16, RoundTripAndRounding) {
  EXPECT_EQ(DecodeBF16(EncodeBF16(1.5f)), 1.5f);
  EXPECT_EQ(EncodeBF16(1.0f + std::ldexp(1.0f, -8)), EncodeBF16(1.0f));  // tie to even
  EXPECT_TRUE(std::isnan(DecodeBF16(EncodeBF16(std::nanf("")))));
}

}  // namespace
}  // namespace ckpt::quant
