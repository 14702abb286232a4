// ckpt-auditd and the tree head it remembers (docs/daemon.md "Database safety"): the shipped
// binary remembers the head of its own appends, adopts a log it has no head for after verifying
// it, adopts a longer consistent log (the appends of a crash between commit and head write), and
// refuses to start on the rollback attack of issue 21 or a fork, exiting non-zero with both heads
// named.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/evidence_log.h"
#include "storage/head_state.h"
#include "tests/daemon/daemon_process.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kOrigin[] = "daemon-head.test/log";

class DaemonHeadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = *evidence::SigningKey::Generate();
    ASSERT_TRUE(key_->Save(key_path_.string()).ok());
  }

  // Records [from, to) appended to the log at `db` under kOrigin, as `ckpt-audit audit` would.
  void Append(const fs::path& db, int from, int to) {
    auto log = storage::EvidenceLog::Open(db.string(), true, kOrigin);
    ASSERT_TRUE(log.ok()) << log.status();
    for (int i = from; i < to; ++i) {
      ASSERT_TRUE((*log)->Append(testing::SampleEnvelope(*key_, i), *key_).ok());
    }
  }
  std::string HeadAt(const fs::path& db, uint64_t size) {
    auto log = storage::EvidenceLog::OpenReadOnly(db.string());
    return storage::DescribeHead({kOrigin, size, *(*log)->RootAt(size)});
  }
  std::vector<std::string> Args(const fs::path& db, const std::string& head = "") {
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--insecure-no-auth",
                                     "--db", db.string(), "--key", key_path_.string(),
                                     "--allow-root", dir_.path().string()};
    if (!head.empty()) args.insert(args.end(), {"--head-state", head});
    return args;
  }
  // Starts the daemon, expecting it to serve; returns its log after a clean stop.
  std::string Serve(const std::vector<std::string>& args) {
    testing::DaemonProcess daemon;
    EXPECT_TRUE(daemon.Start(args, dir_ / "daemon.log")) << daemon.log();
    EXPECT_EQ(daemon.Stop(), 0);
    return daemon.log();
  }
  // Starts the daemon, expecting it to refuse; returns its log.
  std::string Refused(const std::vector<std::string>& args) {
    testing::DaemonProcess daemon;
    EXPECT_FALSE(daemon.Start(args, dir_ / "daemon.log")) << "it started:\n" << daemon.log();
    EXPECT_NE(daemon.exit_code(), 0);
    return daemon.log();
  }
  std::string RememberedNote(const fs::path& head) {
    auto kept = storage::ReadHeadFile(head.string());
    EXPECT_TRUE(kept.ok() && *kept) << kept.status();
    return kept.ok() && *kept ? (*kept)->note : "";
  }
  std::string LatestNote(const fs::path& db) {
    return storage::EvidenceLog::OpenReadOnly(db.string()).value()->LatestCheckpoint()->second;
  }

  testing::TempDir dir_;
  fs::path db_ = dir_ / "ev.db", head_ = dir_ / "ev.db.head", key_path_ = dir_ / "key.pem";
  std::optional<evidence::SigningKey> key_;
};

TEST_F(DaemonHeadTest, RefusesToStartOnARolledBackLog) {
  Append(db_, 0, 6);  // a log built by the CLI: the daemon has no head for it
  std::string first = Serve(Args(db_));
  EXPECT_THAT(first, HasSubstr("verified the whole log (6 entries)"));
  EXPECT_THAT(first, HasSubstr("\"head_adopted\":true"));
  EXPECT_EQ(RememberedNote(head_), LatestNote(db_));
  struct stat st;
  ASSERT_EQ(::stat(head_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(Serve(Args(db_)), Not(HasSubstr("head_adopted\":true")));

  const std::string head6 = HeadAt(db_, 6), head3 = HeadAt(db_, 3);
  fs::copy_file(head_, dir_ / "head.copy");
  ASSERT_EQ(testing::RawDb(db_.string()).DeleteTail(3), SQLITE_OK);
  std::string refused = Refused(Args(db_));
  EXPECT_THAT(refused, HasSubstr("rolled back"));
  EXPECT_THAT(refused, HasSubstr(head6));
  EXPECT_THAT(refused, HasSubstr(head3));
  EXPECT_THAT(refused, HasSubstr(head_.string()));
  EXPECT_EQ(*storage::EvidenceLog::OpenReadOnly(db_.string()).value()->Size(), 3u);
  EXPECT_EQ(testing::ReadText(head_), testing::ReadText(dir_ / "head.copy"));

  // The database removed altogether is no way around it either.
  fs::remove(db_);
  EXPECT_THAT(Refused(Args(db_)), HasSubstr("no evidence database"));
  EXPECT_FALSE(fs::exists(db_));
}

TEST_F(DaemonHeadTest, RefusesToStartOnAFork) {
  const fs::path head = dir_ / "state" / "log.head";  // --head-state names another place
  fs::create_directory(dir_ / "state");
  Append(db_, 0, 4);
  EXPECT_THAT(Serve(Args(db_, head.string())), HasSubstr("head_adopted\":true"));
  EXPECT_FALSE(fs::exists(head_));
  const std::string head4 = HeadAt(db_, 4);
  fs::remove(db_);
  Append(db_, 10, 14);  // the same origin and key, other entries
  std::string refused = Refused(Args(db_, head.string()));
  EXPECT_THAT(refused, HasSubstr("forked"));
  EXPECT_THAT(refused, HasSubstr(head4));
  EXPECT_THAT(refused, HasSubstr(HeadAt(db_, 4)));
}

// kill -9 between an append's commit and its head write leaves the log longer than the head:
// consistent with it, so the daemon adopts it after checking the consistency proof.
TEST_F(DaemonHeadTest, AdoptsALongerConsistentLog) {
  Append(db_, 0, 3);
  Serve(Args(db_));
  const std::string head3 = HeadAt(db_, 3);
  Append(db_, 3, 5);
  std::string log = Serve(Args(db_));
  EXPECT_THAT(log, HasSubstr("extends the remembered head " + head3 + " to " + HeadAt(db_, 5)));
  EXPECT_EQ(RememberedNote(head_), LatestNote(db_));
}

// The daemon's own appends: an audit it runs leaves the checkpoint of its last append in the head
// file, and the rollback attack on that log stops the next start.
TEST_F(DaemonHeadTest, RemembersItsOwnAppends) {
  const fs::path model = testing::CopyFixture("mini-kimi-mxfp4", dir_);
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start(Args(db_), dir_ / "daemon.log")) << daemon.log();
  EXPECT_FALSE(fs::exists(head_));  // a new log: nothing to remember before its first append
  auto stub = pb::AuditService::NewStub(
      grpc::CreateChannel(daemon.address(), grpc::InsecureChannelCredentials()));
  pb::StartAuditRequest req;
  req.set_root(model.string());
  pb::Job job;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub->StartAudit(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int i = 0; i < 600 && job.state() != pb::JOB_STATE_SUCCEEDED; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ClientContext ctx;
    pb::GetJobRequest get;
    get.set_id(job.id());
    ASSERT_TRUE(stub->GetJob(&ctx, get, &job).ok());
    ASSERT_NE(job.state(), pb::JOB_STATE_FAILED) << job.error_message();
  }
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(RememberedNote(head_), LatestNote(db_));  // the record and its test result
  EXPECT_EQ(storage::ReadHeadFile(head_.string())->value().head.size, 2u);
  ASSERT_EQ(daemon.Stop(), 0);

  const std::string head2 = HeadAt(db_, 2), head1 = HeadAt(db_, 1);
  ASSERT_EQ(testing::RawDb(db_.string()).DeleteTail(1), SQLITE_OK);
  std::string refused = Refused(Args(db_));
  EXPECT_THAT(refused, HasSubstr("rolled back"));
  EXPECT_THAT(refused, HasSubstr(head2));
  EXPECT_THAT(refused, HasSubstr(head1));
}

}  // namespace
}  // namespace ckpt
