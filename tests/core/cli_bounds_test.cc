// Every number a caller gives that sizes an allocation, a loop or a thread count is bounded, and
// past its bound is exit 2 with a message naming the flag and the bound: never an abort, a hang
// or gigabytes allocated (README.md, "Limits").
#include <string>

#include "core/fingerprint/fingerprint.h"
#include "core/fingerprint/oms_manifest.h"
#include "core/forward/forward_audit.h"
#include "core/parallel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Fixture;
using ::testing::HasSubstr;
using ::testing::Not;

class CliBoundsTest : public ::ckpt::testing::CliWorkspace {
 protected:
  // `args` refused as a usage error naming `flag` and `bound`, without a crash.
  void Refused(const std::string& args, const std::string& flag, const std::string& bound) {
    ::ckpt::testing::CliResult r = Run(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(flag)) << args;
    EXPECT_THAT(r.err, HasSubstr(bound)) << args;
    EXPECT_THAT(r.err, Not(HasSubstr("terminate called"))) << args;
  }
  const std::string nv_ = Fixture("mini-kimi-nvfp4").string();
  const std::string mx_ = Fixture("mini-kimi-mxfp4").string();
};

TEST_F(CliBoundsTest, PartCountHasAFixedMaximumAndTheTreesFileGroups) {
  const std::string max = std::to_string(kMaxParts);
  ASSERT_EQ(Run("keys generate --out " + Key() + " --trust " + (dir_ / "trusted").string()).rc, 0);
  const std::string audit = "audit --part-key " + Key() + " --out " + (dir_ / "p.json").string();
  for (const std::string& cmd : {std::string("fingerprint --json"), audit}) {
    for (const char* huge : {"0/4294967295", "0/4097", "0/99999999999"}) {
      Refused(cmd + " --part " + huge + " " + nv_, "--part", max);
    }
    for (const char* malformed : {"0/-1", "-1/2", "0/+2", "0/ 2", "0/0", "2/2", "1"}) {
      Refused(cmd + " --part '" + malformed + "' " + nv_, "--part", "0 <= I < N");
    }
    // The fixture has 4 files: a fifth part would read nothing.
    Refused(cmd + " --part 0/5 " + nv_, "--part", "file groups to share out");
  }
}

TEST_F(CliBoundsTest, ThreadsHaveAFixedMaximumInEveryCommand) {
  const std::string max = std::to_string(kMaxThreads);
  const std::string out = (dir_ / "out").string();
  for (const std::string& cmd :
       {"fingerprint " + nv_, "audit --db " + Db() + " " + nv_, "quant-check " + nv_,
        "verify-pair --source " + mx_ + " --derived " + nv_,
        "transcode --to nvfp4 " + mx_ + " " + out,
        "sign --out " + out + " " + nv_, "verify-signature --signature " + out + " " + nv_,
        "verify-chain " + nv_, "forward --source " + mx_ + " --root " + nv_ + " --layers 1"}) {
    Refused(cmd + " --threads 100000", "--threads", max);
  }
}

TEST_F(CliBoundsTest, TokensOfTheSeededInputHaveAMaximum) {
  Refused("forward --source " + mx_ + " --root " + nv_ + " --layers 1 --tokens " +
              std::to_string(forward::kMaxTokens + 1),
          "--tokens", "[1, " + std::to_string(forward::kMaxTokens) + "]");
}

TEST_F(CliBoundsTest, ShardSizeThatCutsTooManyShardsIsRefused) {
  // 5 MB in 1-byte shards: five million digests.
  Refused("fingerprint --manifest oms-shards --shard-size 1 " + nv_, "--shard-size",
          "more than " + std::to_string(kMaxOmsShards));
  ::ckpt::testing::CliResult fits =
      Run("fingerprint --manifest oms-shards --shard-size 1048576 " + nv_);
  EXPECT_EQ(fits.rc, 0) << fits.err;
}

}  // namespace
}  // namespace ckpt
