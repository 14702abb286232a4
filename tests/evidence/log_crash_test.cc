// Crash safety: a child appends in a loop and is SIGKILLed at a random moment, 20 times. After
// each kill the log must open, pass integrity_check and verify-log, and hold every record the
// child reported as committed (it writes each seq to a pipe only after Append returned). The
// child keeps its tree head in a file (storage/head_state.h), as the daemon does: a kill between
// the commit and the head write leaves a log longer than the head, which must be adopted, never
// refused.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <set>

#include "gtest/gtest.h"
#include "storage/evidence_log.h"
#include "storage/head_state.h"
#include "storage/log_verifier.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_util.h"

namespace ckpt::storage {
namespace {

[[noreturn]] void AppendForever(const std::string& path, const std::string& head_path,
                                const evidence::SigningKey& key, int out_fd) {
  auto log = EvidenceLog::Open(path, true, "crash.test/log");
  if (!log.ok() || !(*log)->KeepHeadIn(head_path).ok()) ::_exit(3);
  for (int i = 0;; ++i) {
    auto r = (*log)->Append(testing::SampleEnvelope(key, i), key);
    if (!r.ok()) ::_exit(4);
    uint64_t seq = r->seq;
    if (::write(out_fd, &seq, sizeof(seq)) != sizeof(seq)) ::_exit(5);
  }
}

TEST(LogCrash, SigkillMidAppendLosesNothingCommitted) {
  testing::TempDir dir;
  std::string path = (dir / "log.db").string();
  std::string head_path = (dir / "log.head").string();
  auto key = *evidence::SigningKey::Generate();
  evidence::TrustStore trust;
  trust.Add(key.public_key());
  std::mt19937 rng(20261129);
  std::set<uint64_t> reported;
  for (int round = 0; round < 20; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      AppendForever(path, head_path, key, fds[1]);
    }
    ::close(fds[1]);
    // Let it commit a few records, then kill it at a random point of the next ones: sometimes
    // right after a report, sometimes after a sub-millisecond delay inside the next transaction.
    int wanted = 1 + static_cast<int>(rng() % 4);
    for (int got = 0; got < wanted;) {
      uint64_t seq;
      ssize_t n = ::read(fds[0], &seq, sizeof(seq));
      ASSERT_EQ(n, static_cast<ssize_t>(sizeof(seq))) << "child died early, round " << round;
      reported.insert(seq);
      ++got;
    }
    ::usleep(rng() % 3000);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round;
    // Reports that reached the pipe before the kill are commits too.
    uint64_t seq;
    while (::read(fds[0], &seq, sizeof(seq)) == sizeof(seq)) reported.insert(seq);
    ::close(fds[0]);

    auto start = CheckHeadAtStart(path, head_path, trust);
    ASSERT_TRUE(start.ok()) << "round " << round << ": " << start.status();
    auto log = EvidenceLog::Open(path, false);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_TRUE((*log)->KeepHeadIn(head_path).ok());
    EXPECT_EQ(ReadHeadFile(head_path)->value().head.size, *(*log)->Size());
    EXPECT_EQ(*(*log)->IntegrityCheck(), "ok");
    auto v = VerifyLog(**log, trust);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(v->ok()) << "round " << round << ": " << v->problems[0];
    for (uint64_t s : reported) EXPECT_TRUE((*log)->Get(s).ok()) << "lost record " << s;
  }
  EXPECT_GE(reported.size(), 20u);
}

// Two processes that try to write one log: while one holds it, the other is refused at open
// (not merely serialized), with the holder's pid; once the first closes, the second writes.
// Readers in another process are never refused. Afterwards the log verifies.
TEST(LogCrash, SecondWriterProcessIsRefused) {
  testing::TempDir dir;
  std::string path = (dir / "log.db").string();
  auto key = *evidence::SigningKey::Generate();
  evidence::TrustStore trust;
  trust.Add(key.public_key());
  auto child_tries = [&](bool write) {
    pid_t child = ::fork();
    if (child == 0) {
      if (!write) {
        auto reader = EvidenceLog::OpenReadOnly(path);
        ::_exit(reader.ok() && *(*reader)->Size() == 3 ? 0 : 6);
      }
      auto log = EvidenceLog::Open(path, false);
      if (!log.ok()) {
        bool refused = log.status().code() == absl::StatusCode::kFailedPrecondition &&
                       log.status().message().find("another writer (pid") != std::string::npos;
        ::_exit(refused ? 5 : 3);
      }
      ::_exit((*log)->Append(testing::SampleEnvelope(key, 100), key).ok() ? 0 : 4);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  {
    auto log = EvidenceLog::Open(path, true, "writers.test/log");
    ASSERT_TRUE(log.ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*log)->Append(testing::SampleEnvelope(key, i), key).ok());
    }
    EXPECT_EQ(child_tries(/*write=*/true), 5);   // refused while held
    EXPECT_EQ(child_tries(/*write=*/false), 0);  // readers are not
  }
  EXPECT_EQ(child_tries(/*write=*/true), 0);  // released with the first writer
  auto log = EvidenceLog::OpenReadOnly(path);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(*(*log)->Size(), 4u);
  auto v = VerifyLog(**log, trust);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << v->problems[0];
}

}  // namespace
}  // namespace ckpt::storage
