// The CLI's one size parser (services/cli/cli_util.h): byte counts and binary sizes; zero,
// values below the minimum, fractions of a byte, junk and overflow are INVALID_ARGUMENT naming
// the flag.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cli/cli_util.h"

namespace ckpt::cli {
namespace {

using ::testing::HasSubstr;

uint64_t Parse(std::string_view text, uint64_t minimum = 1) {
  absl::StatusOr<uint64_t> v = ParseByteSize(text, "--memory-window", minimum);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.value_or(0);
}

TEST(ParseByteSize, CountsAndBinarySizes) {
  EXPECT_EQ(Parse("1048576"), 1048576u);
  EXPECT_EQ(Parse("256M"), 256ull << 20);
  EXPECT_EQ(Parse("256MiB"), 256ull << 20);
  EXPECT_EQ(Parse("256mi"), 256ull << 20);
  EXPECT_EQ(Parse("1.5G"), 1536ull << 20);
  EXPECT_EQ(Parse("2GiB"), 2ull << 30);
  EXPECT_EQ(Parse("64K"), 64ull << 10);
  EXPECT_EQ(Parse("3T"), 3ull << 40);
  EXPECT_EQ(Parse("0.5K"), 512u);
  EXPECT_EQ(Parse("12B"), 12u);
  EXPECT_EQ(Parse("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(Parse("16777215T"), 16777215ull << 40);  // 2^64 - 2^40
}

TEST(ParseByteSize, RefusesWithTheFlagNamed) {
  for (const char* bad : {"0", "0G", "", "M", "-1", "1.5", "1.3K", "1.", ".5G", "12Q", "1GB",
                          "1 G", "1e9", "18446744073709551616", "16777216T", "99999999999999999999999",
                          "1K", "65535"}) {
    absl::StatusOr<uint64_t> v = ParseByteSize(bad, "--memory-window", 64 << 10);
    ASSERT_FALSE(v.ok()) << bad << " = " << *v;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("--memory-window '")) << bad;
  }
  EXPECT_EQ(Parse("65536", 64 << 10), 65536u);
}

}  // namespace
}  // namespace ckpt::cli
