// RunCommand (services/daemon/command.h): exit codes and both outputs, no shell, bounded output,
// a deadline that kills, a program that does not exist.
#include "services/daemon/command.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

TEST(CommandTest, ExitCodeAndBothOutputs) {
  auto r = RunCommand({"sh", "-c", "echo out; echo err >&2; exit 3"}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "out\n");
  EXPECT_EQ(r->err, "err\n");
}

TEST(CommandTest, ArgumentsAreNotShellWords) {
  auto r = RunCommand({"echo", "$(id)", "a b", "'q'"}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->out, "$(id) a b 'q'\n");
}

TEST(CommandTest, OutputIsBounded) {
  auto r = RunCommand({"head", "-c", "3000000", "/dev/zero"}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(r->out.size(), kMaxCommandOutput);
}

TEST(CommandTest, DeadlineKills) {
  const absl::Time start = absl::Now();
  auto r = RunCommand({"sleep", "30"}, absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(CommandTest, MissingProgramIsUnavailable) {
  auto r = RunCommand({"/nonexistent/sbatch"}, absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/sbatch"));
}

}  // namespace
}  // namespace ckpt::daemon
