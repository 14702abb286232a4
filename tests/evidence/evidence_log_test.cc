// The SQLite evidence log: appends, proofs, queries, append-only triggers, and verify-log
// catching each kind of tampering (the tests play the attacker through the sqlite3 C API).
#include "storage/evidence_log.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "core/evidence/base64.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/head_state.h"
#include "storage/job_table.h"
#include "storage/log_verifier.h"
#include "storage/tlog_checkpoint.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_util.h"

namespace ckpt::storage {
namespace {

using ::ckpt::testing::RawDb;
using ::ckpt::testing::SampleEnvelope;
using ::ckpt::testing::TempDir;
using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;

// The log file's PRAGMA user_version (its schema version).
int UserVersion(const std::string& path) {
  RawDb db(path);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db.get(), "PRAGMA user_version", -1, &st, nullptr);
  const int version = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
  sqlite3_finalize(st);
  return version;
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = *evidence::SigningKey::Generate();
    trust_.Add(key_->public_key());
    path_ = (dir_ / "log.db").string();
  }
  std::unique_ptr<EvidenceLog> Open() {
    auto log = EvidenceLog::Open(path_, /*create=*/true, "test.example/log");
    EXPECT_TRUE(log.ok()) << log.status();
    return std::move(*log);
  }
  void Fill(int n) {
    auto log = Open();
    for (int i = 0; i < n; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(*key_, i), *key_).ok());
  }
  std::string AllProblems() {
    std::string all;
    for (const auto& p : VerifyLogFile(path_, trust_).problems) all += p + "\n";
    return all;
  }

  TempDir dir_;
  std::optional<evidence::SigningKey> key_;
  evidence::TrustStore trust_;
  std::string path_;
};

TEST_F(LogTest, AppendsProvesAndVerifies) {
  auto log = Open();
  std::vector<Hash> roots;
  for (int i = 0; i < 13; ++i) {
    auto r = log->Append(SampleEnvelope(*key_, i), *key_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->seq, static_cast<uint64_t>(i));
    EXPECT_EQ(r->tree_size, static_cast<uint64_t>(i + 1));
    auto head = VerifyCheckpoint(r->checkpoint, "test.example/log", trust_);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->root, r->root);
    roots.push_back(r->root);
  }
  EXPECT_EQ(*log->Size(), 13u);
  auto e = log->Get(7);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->envelope, SampleEnvelope(*key_, 7));  // Ed25519 signing is deterministic
  for (uint64_t n = 1; n <= 13; ++n) {
    for (uint64_t i = 0; i < n; ++i) {
      auto entry = log->Get(i);
      auto proof = log->InclusionProof(i, n);
      ASSERT_TRUE(proof.ok());
      EXPECT_TRUE(VerifyInclusion(LeafHash(evidence::AsBytes(entry->envelope)), i, n, *proof,
                                  roots[n - 1])
                      .ok());
    }
    for (uint64_t m = 1; m <= n; ++m) {
      auto proof = log->ConsistencyProof(m, n);
      ASSERT_TRUE(proof.ok());
      EXPECT_TRUE(VerifyConsistency(m, n, *proof, roots[m - 1], roots[n - 1]).ok());
    }
  }
  auto v = VerifyLog(*log, trust_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->ok()) << v->problems[0];
  EXPECT_EQ(v->entries, 13u);
  EXPECT_EQ(v->checkpoints, 13u);
  EXPECT_EQ(v->signatures_verified, 13u);
}

TEST_F(LogTest, PragmasAndSchemaVersion) {
  Fill(1);
  EXPECT_EQ(UserVersion(path_), kLogSchemaVersion);
  RawDb db(path_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db.get(), "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  // A newer schema than this tool knows is refused rather than misread.
  ASSERT_EQ(db.Exec("PRAGMA user_version = 99"), SQLITE_OK);
  auto log = EvidenceLog::Open(path_, false);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A log of the previous schema (5) is migrated when a writer opens it: its jobs keep every
// column, and the new one reads as no referrers; until then the jobs table reads it so too.
TEST_F(LogTest, AVersion5LogIsMigratedKeepingItsJobs) {
  Fill(2);
  {
    RawDb db(path_);
    ASSERT_EQ(db.Exec("INSERT INTO jobs(seq, id, root, source_root, policy, root_map, invoker,"
                      " state, verdict, record_id, error_code, error_message, created_at,"
                      " finished_at, executor_job) VALUES(1, 'job-1', '/m', '', 'scale-window',"
                      " '', 'ci', 'succeeded', 'pass', 1, 0, '', '2026-01-01T00:00:00.000Z',"
                      " '2026-01-01T00:00:09.000Z', '42')"),
              SQLITE_OK)
        << db.error();
    ASSERT_EQ(db.Exec("ALTER TABLE jobs DROP COLUMN referrers"), SQLITE_OK) << db.error();
    ASSERT_EQ(db.Exec("PRAGMA user_version = 5"), SQLITE_OK);
  }
  // Read through a read-only jobs table opened on the log as it is now.
  auto job1 = [&]() -> absl::StatusOr<JobRow> {
    auto table = JobTable::Open(path_, "log", std::nullopt);
    if (!table.ok()) return table.status();
    return (*table)->Get("job-1");
  };
  auto before = job1();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->referrers, "");
  EXPECT_EQ(before->executor_job, "42");

  auto log = Open();
  EXPECT_EQ(*log->Size(), 2u);
  EXPECT_EQ(UserVersion(path_), kLogSchemaVersion);
  auto after = job1();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state, "succeeded");
  EXPECT_EQ(after->verdict, "pass");
  EXPECT_EQ(after->record_id, 1);
  EXPECT_EQ(after->finished_at, "2026-01-01T00:00:09.000Z");
  EXPECT_EQ(after->executor_job, "42");
  EXPECT_EQ(after->referrers, "");
  EXPECT_TRUE(VerifyLogFile(path_, trust_).ok());
  EXPECT_EQ(AllProblems(), "");
}

TEST_F(LogTest, TriggersRefuseUpdateDeleteAndReplace) {
  Fill(3);
  RawDb db(path_);
  ASSERT_EQ(db.Exec("PRAGMA recursive_triggers = ON"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE entries SET verdict = 'pass' WHERE seq = 1"), SQLITE_OK);
  EXPECT_THAT(db.error(), HasSubstr("append-only"));
  EXPECT_NE(db.Exec("DELETE FROM entries WHERE seq = 2"), SQLITE_OK);
  EXPECT_NE(db.Exec("DELETE FROM checkpoints"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE tree_nodes SET hash = x'00' WHERE level = 0"), SQLITE_OK);
  EXPECT_NE(db.Exec("INSERT OR REPLACE INTO entries SELECT * FROM entries WHERE seq = 0"),
            SQLITE_OK);
  EXPECT_NE(db.Exec("REPLACE INTO meta(key, value) VALUES('origin', 'evil')"), SQLITE_OK);
  EXPECT_TRUE(VerifyLogFile(path_, trust_).ok());
}

TEST_F(LogTest, QueryFiltersAndPaginates) {
  auto log = Open();
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(log->Append(SampleEnvelope(*key_, i, i % 5 == 0 ? "fail" : "pass"), *key_).ok());
  }
  std::vector<uint64_t> seen;
  QueryFilter f;
  f.limit = 10;
  int pages = 0;
  do {
    auto page = log->Query(f);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& e : page->entries) seen.push_back(e.seq);
    f.page_token = page->next_page_token;
    ++pages;
  } while (!f.page_token.empty());
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 25u);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 24 - i);  // newest first

  QueryFilter fails;
  fails.verdict = "fail";
  auto page = log->Query(fails);
  ASSERT_EQ(page->entries.size(), 5u);
  for (const auto& e : page->entries) EXPECT_EQ(e.seq % 5, 0u);

  QueryFilter by_root;
  by_root.root = "/models/m1";
  by_root.policy = "strict";  // odd i; with i % 3 == 1: 1, 7, 13, 19
  EXPECT_EQ(log->Query(by_root)->entries.size(), 4u);

  auto env = evidence::ParseEnvelope(log->Get(11)->envelope);
  auto idx = evidence::IndexPayload(env->payload);
  QueryFilter by_digest;
  by_digest.digest = idx->subjects[0].sha256;
  auto hit = log->Query(by_digest);
  ASSERT_EQ(hit->entries.size(), 1u);
  EXPECT_EQ(hit->entries[0].seq, 11u);

  QueryFilter by_time;
  by_time.since = absl::FromCivil(absl::CivilDay(2026, 1, 3), absl::UTCTimeZone());
  by_time.until = absl::FromCivil(absl::CivilDay(2026, 1, 5), absl::UTCTimeZone());
  // days 3 and 4: i = 2, 3
  EXPECT_EQ(log->Query(by_time)->entries.size(), 2u);

  QueryFilter bad;
  bad.page_token = "abc";
  EXPECT_EQ(log->Query(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LogTest, StoredNodesGiveTheSameProofsAsAMemoryTree) {
  // A batch append at a size with a ragged right edge: proofs from stored nodes equal the
  // in-memory tree's.
  auto log = Open();
  std::vector<std::string> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(SampleEnvelope(*key_, i));
  ASSERT_TRUE(log->AppendBatch(batch, *key_).ok());
  MemoryTree mem;
  for (const auto& e : batch) mem.Append(LeafHash(evidence::AsBytes(e)));
  EXPECT_EQ(*log->RootAt(100), mem.Root());
  EXPECT_EQ(*log->InclusionProof(37, 100), *storage::InclusionProof(mem, 37, 100));
  EXPECT_EQ(*log->ConsistencyProof(37, 100), *storage::ConsistencyProof(mem, 37, 100));
  EXPECT_TRUE(VerifyLogFile(path_, trust_).ok());
}

TEST_F(LogTest, VerifyDetectsEditedRow) {
  Fill(6);
  RawDb db(path_);
  db.DropTriggers();
  auto log = EvidenceLog::Open(path_, false);
  std::string env = (*log)->Get(2)->envelope;
  log->reset();
  // Flip the verdict inside the signed payload, keep the old signature.
  auto parsed = evidence::ParseEnvelope(env);
  std::string payload = parsed->payload;
  payload.replace(payload.find("\"verdict\":\"pass\""), 16, "\"verdict\":\"fail\"");
  nlohmann::json j = nlohmann::json::parse(env);
  j["payload"] = evidence::Base64Encode(payload);
  db.SetBlob("UPDATE entries SET envelope = ? WHERE seq = 2", j.dump());
  std::string problems = AllProblems();
  EXPECT_THAT(problems, HasSubstr("entry 2: stored leaf hash does not match"));
  EXPECT_THAT(problems, HasSubstr("entry 2: DSSE signature by trusted key"));
  EXPECT_THAT(problems, HasSubstr("trigger entries_no_UPDATE is missing"));
}

TEST_F(LogTest, VerifyDetectsDeletedRow) {
  Fill(6);
  RawDb db(path_);
  db.DropTriggers();
  ASSERT_EQ(db.Exec("DELETE FROM subjects WHERE seq = 3; DELETE FROM entries WHERE seq = 3"),
            SQLITE_OK);
  EXPECT_THAT(AllProblems(), HasSubstr("entry 3 is missing"));
}

TEST_F(LogTest, VerifyDetectsDeletedTail) {
  // Deleting the newest entries and their checkpoints leaves the older checkpoints; the
  // remaining ones still verify, but the tree nodes the tail finished betray it.
  Fill(6);
  RawDb db(path_);
  db.DropTriggers();
  ASSERT_EQ(db.Exec("DELETE FROM subjects WHERE seq = 5; DELETE FROM entries WHERE seq = 5;"
                    " DELETE FROM checkpoints WHERE size = 6"),
            SQLITE_OK);
  EXPECT_THAT(AllProblems(), HasSubstr("tree nodes"));
}

TEST_F(LogTest, VerifyDetectsReorderedRows) {
  Fill(6);
  RawDb db(path_);
  db.DropTriggers();
  ASSERT_EQ(db.Exec("UPDATE entries SET seq = -1 WHERE seq = 1;"
                    "UPDATE entries SET seq = 1 WHERE seq = 2;"
                    "UPDATE entries SET seq = 2 WHERE seq = -1;"),
            SQLITE_OK);
  std::string problems = AllProblems();
  EXPECT_THAT(problems, HasSubstr("signed root differs from the recomputed root"));
  EXPECT_THAT(problems, HasSubstr("tree node level 0 index 1 differs"));
}

TEST_F(LogTest, VerifyDetectsRecordResignedWithUnknownKey) {
  Fill(6);
  auto intruder = *evidence::SigningKey::Generate();
  std::string forged = SampleEnvelope(intruder, 4, "pass");
  RawDb db(path_);
  db.DropTriggers();
  db.SetBlob("UPDATE entries SET envelope = ? WHERE seq = 4", forged);
  Hash leaf = LeafHash(evidence::AsBytes(forged));
  db.SetBlob("UPDATE entries SET leaf_hash = ? WHERE seq = 4",
             std::string(leaf.begin(), leaf.end()));
  db.SetBlob("UPDATE tree_nodes SET hash = ? WHERE level = 0 AND idx = 4",
             std::string(leaf.begin(), leaf.end()));
  std::string problems = AllProblems();
  EXPECT_THAT(problems, HasSubstr("entry 4: DSSE envelope signed only by untrusted keys: " +
                                  intruder.public_key().KeyId()));
  EXPECT_THAT(problems, HasSubstr("signed root differs"));
}

TEST_F(LogTest, VerifyDetectsUntrustedCheckpointKey) {
  Fill(3);
  evidence::TrustStore other;
  other.Add(evidence::SigningKey::Generate()->public_key());
  auto v = VerifyLogFile(path_, other);
  EXPECT_FALSE(v.ok());
  EXPECT_THAT(v.problems, Contains(HasSubstr("no signature by a trusted key verifies")));
}

TEST_F(LogTest, VerifyDetectsTruncatedFile) {
  Fill(40);  // enough pages that truncation cuts through the tables
  auto size = std::filesystem::file_size(path_);
  ASSERT_GT(size, 16384u);
  std::filesystem::resize_file(path_, size / 2);
  auto v = VerifyLogFile(path_, trust_);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.problems[0], AnyOf(HasSubstr("DATA_LOSS"), HasSubstr("integrity_check")));

  std::filesystem::resize_file(path_, 100);  // not even a database header
  EXPECT_FALSE(VerifyLogFile(path_, trust_).ok());
}

// A rotation names the old key (docs/evidence.md, "One key per log"): the first checkpoint under
// the new key is cosigned by the old one. Without it, another key's append is refused.
TEST_F(LogTest, KeyRotationKeepsOldEntriesVerifiable) {
  Fill(3);  // records and checkpoints 1..3 signed by the old key
  auto next = *evidence::SigningKey::Generate();
  {
    auto log = Open();
    auto refused = log->Append(SampleEnvelope(next, 3), next);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("its checkpoints are signed by key " + key_->public_key().KeyId()));
    EXPECT_EQ(*log->Size(), 3u);
    auto handover = log->Append(SampleEnvelope(next, 3), next, &*key_);
    ASSERT_TRUE(handover.ok()) << handover.status();
    evidence::TrustStore old_only;
    old_only.Add(key_->public_key());
    EXPECT_TRUE(storage::VerifyCheckpoint(handover->checkpoint, "test.example/log", old_only).ok());
    for (int i = 4; i < 6; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(next, i), next).ok());
    // The old key alone no longer appends: the latest checkpoint is the new key's.
    EXPECT_FALSE(log->Append(SampleEnvelope(*key_, 6), *key_).ok());
  }
  trust_.Add(next.public_key());  // old key kept in the trust file: everything verifies
  EXPECT_TRUE(VerifyLogFile(path_, trust_).ok());
  evidence::TrustStore only_new;  // old key removed: its records and checkpoints fail
  only_new.Add(next.public_key());
  std::string problems;
  for (const auto& p : VerifyLogFile(path_, only_new).problems) problems += p + "\n";
  EXPECT_THAT(problems, HasSubstr("entry 2: DSSE envelope signed only by untrusted keys"));
  EXPECT_THAT(problems, HasSubstr("checkpoint test.example/log@3: no signature by a trusted key"));
  EXPECT_THAT(problems, ::testing::Not(HasSubstr("entry 3:")));
  EXPECT_THAT(problems, ::testing::Not(HasSubstr("log@4")));  // cosigned by the new key
}

TEST_F(LogTest, RejectsEnvelopeThatIsNotEvidence) {
  auto log = Open();
  EXPECT_FALSE(log->Append("{}", *key_).ok());
  std::string not_statement =
      *evidence::SignEnvelope("{\"x\":1}", evidence::kInTotoPayloadType, *key_);
  EXPECT_EQ(log->Append(not_statement, *key_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*log->Size(), 0u);
}

// Finding: the database was created 0644. Every file of a new log is 0600 whatever the umask.
TEST_F(LogTest, NewLogFilesAreOwnerOnly) {
  mode_t old = ::umask(0);
  {
    auto log = Open();
    ASSERT_TRUE(log->Append(SampleEnvelope(*key_, 0), *key_).ok());
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
      struct stat st;
      ASSERT_EQ(::stat((path_ + suffix).c_str(), &st), 0) << suffix;
      EXPECT_EQ(st.st_mode & 0777, 0600u) << path_ << suffix;
    }
  }
  ::umask(old);
}

// Finding: two writers could share one log. The second is refused while the first lives, and
// names the holder; readers are never refused.
TEST_F(LogTest, SecondWriterIsRefusedReadersAreNot) {
  auto first = Open();
  auto second = EvidenceLog::Open(path_, /*create=*/true);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("another writer (pid ", ::getpid())));
  auto reader = EvidenceLog::OpenReadOnly(path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(first->Append(SampleEnvelope(*key_, 0), *key_).ok());
  EXPECT_EQ(*(*reader)->Size(), 1u);
  EXPECT_FALSE((*reader)->append_status().ok());
  EXPECT_FALSE((*reader)->Append(SampleEnvelope(*key_, 1), *key_).ok());
  first.reset();
  EXPECT_TRUE(EvidenceLog::Open(path_, /*create=*/false).ok());
}

// Finding: a corrupted database was still appended to. quick_check at open refuses appends;
// reads of intact pages and verification still work.
TEST_F(LogTest, DamagedLogRefusesAppendsButServesReadsAndVerification) {
  Fill(30);
  int64_t page = 0, page_size = 0;
  {
    RawDb db(path_);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db.get(), "SELECT rootpage FROM sqlite_schema WHERE name = 'entries_time'",
                       -1, &st, nullptr);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    page = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_prepare_v2(db.get(), "PRAGMA page_size", -1, &st, nullptr);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    page_size = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }  // the last connection closes: the WAL is folded into the file
  {
    // The b-tree page type byte of the time index's root: an invalid type.
    std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((page - 1) * page_size);
    f.put('\x07');
  }
  auto log = EvidenceLog::Open(path_, /*create=*/false);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->append_status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT((*log)->append_status().message(), HasSubstr("quick_check"));
  auto refused = (*log)->Append(SampleEnvelope(*key_, 99), *key_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(*(*log)->Size(), 30u);  // nothing was added
  auto entry = (*log)->Get(7);
  ASSERT_TRUE(entry.ok()) << entry.status();
  auto v = VerifyLog(**log, trust_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->ok());  // integrity_check names the damage
}

// Finding: a read-only filesystem could not be queried. A database file without write
// permission opens read-only (for root too), answers queries and verifies; appends are refused.
TEST_F(LogTest, ReadOnlyFileIsQueriedAndVerified) {
  Fill(5);
  std::filesystem::permissions(path_, std::filesystem::perms::owner_read |
                                          std::filesystem::perms::group_read);
  auto log = EvidenceLog::Open(path_, /*create=*/true);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->append_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT((*log)->append_status().message(), HasSubstr("no write permission"));
  QueryFilter all;
  auto page = (*log)->Query(all);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->entries.size(), 5u);
  auto v = VerifyLog(**log, trust_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->ok()) << v->problems[0];
  EXPECT_FALSE((*log)->Append(SampleEnvelope(*key_, 5), *key_).ok());
}

// On read-only media SQLite cannot create the WAL index (-shm). With no WAL to lose, the reader
// falls back to immutable mode. A directory in the -shm file's place stands in for the media.
TEST_F(LogTest, ReaderFallsBackToImmutableWhenTheWalIndexCannotBeCreated) {
  Fill(4);
  ASSERT_FALSE(std::filesystem::exists(path_ + "-wal"));
  std::filesystem::create_directory(path_ + "-shm");
  auto log = EvidenceLog::OpenReadOnly(path_);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(*(*log)->Size(), 4u);
  auto v = VerifyLog(**log, trust_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->ok()) << v->problems[0];
}

// Finding 3 (defence in depth): index rows can only be added for the entry being appended.
TEST_F(LogTest, IndexRowsForOldEntriesAreRefused) {
  Fill(3);
  RawDb db(path_);
  EXPECT_NE(db.Exec("INSERT INTO subjects(seq, name, sha256) VALUES(0, 'oms-manifest-root', "
                    "'" + std::string(64, 'a') + "')"),
            SQLITE_OK);
  EXPECT_THAT(db.error(), HasSubstr("belong to the entry being appended"));
  EXPECT_NE(db.Exec("INSERT INTO entries SELECT seq + 10, envelope, leaf_hash, predicate_type,"
                    " keyid, root_path, policy, verdict, audit_time FROM entries WHERE seq = 0"),
            SQLITE_OK);
  EXPECT_THAT(db.error(), HasSubstr("seq order"));
  EXPECT_NE(db.Exec("INSERT INTO checkpoints(size, note) VALUES(1, 'x')"), SQLITE_OK);
  // Jobs change state, but are never deleted and their requests never change.
  ASSERT_EQ(db.Exec("INSERT INTO jobs VALUES(1, 'job-1', '/m', '', 'scale-window', '', '',"
                    " 'queued', '', -1, 0, '', '2026-01-01T00:00:00.000Z', '', 'all', 'cuda', '',"
                    " 'c0de', 0, 3, '', '')"),
            SQLITE_OK);
  EXPECT_EQ(db.Exec("UPDATE jobs SET interruptions = 1 WHERE id = 'job-1'"), SQLITE_OK);
  // Schema 5: the Slurm array running a job is recorded when submitted; its part count is fixed.
  EXPECT_EQ(db.Exec("UPDATE jobs SET executor_job = '42' WHERE id = 'job-1'"), SQLITE_OK);
  // Schema 6: the referrers an attach pushed are state, like the outcome.
  EXPECT_EQ(db.Exec("UPDATE jobs SET referrers = 'sha256:1 p tag' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE jobs SET parts = 1 WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE jobs SET mac = '' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_EQ(db.Exec("UPDATE jobs SET state = 'running' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE jobs SET root = '/etc' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE jobs SET device = 'cpu' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("UPDATE jobs SET forward_layers = '' WHERE id = 'job-1'"), SQLITE_OK);
  EXPECT_NE(db.Exec("DELETE FROM jobs"), SQLITE_OK);
  // Dropping the triggers is possible for whoever owns the file, and verify-log says so.
  ASSERT_EQ(db.Exec("DROP TRIGGER subjects_of_newest"), SQLITE_OK);
  EXPECT_THAT(AllProblems(), HasSubstr("subjects_of_newest is missing"));
}

// Finding 10: times compare as times, whatever offset the filter was written with.
TEST_F(LogTest, TimeFiltersCompareInstants) {
  Fill(6);  // finished_at 2026-01-0{1..6}T00:00:01.000Z
  auto log = Open();
  absl::Time t;
  std::string err;
  // 2026-01-03T02:00:01+02:00 is 2026-01-03T00:00:01Z: inclusive, so days 3..6.
  ASSERT_TRUE(absl::ParseTime(absl::RFC3339_full, "2026-01-03T02:00:01+02:00", &t, &err));
  QueryFilter f;
  f.since = t;
  EXPECT_EQ(log->Query(f)->entries.size(), 4u);
  // One nanosecond later excludes day 3 (stored times are whole milliseconds, rounded up).
  f.since = t + absl::Nanoseconds(1);
  EXPECT_EQ(log->Query(f)->entries.size(), 3u);
  QueryFilter until;
  until.until = t;  // exclusive: days 1 and 2
  EXPECT_EQ(log->Query(until)->entries.size(), 2u);
  QueryFilter far;
  far.since = absl::InfiniteFuture();
  EXPECT_TRUE(log->Query(far)->entries.empty());
  far.since = absl::InfinitePast();
  far.until = absl::InfiniteFuture();
  EXPECT_EQ(log->Query(far)->entries.size(), 6u);
}

TEST_F(LogTest, PredicateTypeFilterSeparatesDecisionsFromAudits) {
  auto log = Open();
  ASSERT_TRUE(log->Append(SampleEnvelope(*key_, 0), *key_).ok());
  evidence::EvidenceRecord r;
  r.root = "/models/m0";
  r.subjects = {{"model.safetensors", std::string(64, 'b')}};
  r.policy = {"gate-none", "1"};
  r.finished_at = "2026-01-01T00:00:02.000Z";
  auto vsa = evidence::VerificationSummaryPayload(r, "https://v.example", "", "");
  ASSERT_TRUE(vsa.ok());
  ASSERT_TRUE(log->Append(*evidence::SignEnvelope(*vsa, evidence::kInTotoPayloadType, *key_),
                          *key_).ok());
  QueryFilter audits;
  audits.predicate_type = evidence::kEvidencePredicateType;
  auto a = log->Query(audits);
  ASSERT_EQ(a->entries.size(), 1u);
  EXPECT_EQ(a->entries[0].seq, 0u);
  QueryFilter gates;
  gates.predicate_type = evidence::kVerificationSummaryType;
  auto g = log->Query(gates);
  ASSERT_EQ(g->entries.size(), 1u);
  EXPECT_EQ(g->entries[0].seq, 1u);
}

// VerifyLog in incremental mode: from a clean run's state, the log's consistency proof to the
// newest checkpoint and only the newer entries.
TEST_F(LogTest, IncrementalVerificationChecksOnlyNewEntriesAndTheConsistencyProof) {
  Fill(10);
  VerifiedLogState state;
  {
    auto reader = EvidenceLog::OpenReadOnly(path_);
    auto full = VerifyLogFrom(**reader, trust_, {}, &state);
    ASSERT_TRUE(full.ok() && full->ok());
    EXPECT_EQ(state.size, 10u);
  }
  {
    auto log = Open();
    for (int i = 10; i < 15; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(*key_, i), *key_).ok());
  }
  auto reader = EvidenceLog::OpenReadOnly(path_);
  VerifiedLogState next;
  auto inc = VerifyLogFrom(**reader, trust_, state, &next);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_TRUE(inc->ok()) << inc->problems[0];
  EXPECT_EQ(inc->verified_from, 10u);
  EXPECT_EQ(inc->entries, 15u);
  EXPECT_EQ(inc->checkpoints, 5u);
  EXPECT_EQ(next.size, 15u);

  // A new entry rewritten after the fact is caught by the incremental run.
  {
    RawDb db(path_);
    db.DropTriggers();
    ASSERT_EQ(db.Exec("UPDATE entries SET verdict = 'fail' WHERE seq = 12"), SQLITE_OK);
  }
  auto tampered = VerifyLogFrom(**reader, trust_, state, nullptr);
  ASSERT_TRUE(tampered.ok());
  EXPECT_FALSE(tampered->ok());
  // A stored tree node of the already-verified range, changed before the next append, breaks
  // the log's consistency proof from the verified checkpoint.
  {
    RawDb db(path_);
    ASSERT_EQ(db.Exec("UPDATE entries SET verdict = 'pass' WHERE seq = 12"), SQLITE_OK);
    ASSERT_EQ(db.Exec("UPDATE tree_nodes SET hash = zeroblob(32) WHERE level = 3 AND idx = 0"),
              SQLITE_OK);
  }
  {
    auto log = Open();
    ASSERT_TRUE(log->Append(SampleEnvelope(*key_, 15), *key_).ok());
  }
  auto inconsistent = VerifyLogFrom(**reader, trust_, next, nullptr);
  ASSERT_TRUE(inconsistent.ok());
  std::string problems;
  for (const auto& p : inconsistent->problems) problems += p + "\n";
  EXPECT_THAT(problems, HasSubstr("consistency proof"));
}

// The rollback attack of issue 21 (docs/evidence.md "Rollback and fork detection"): the tail of
// the log deleted with its nodes and checkpoints, triggers dropped and created again. Nothing in
// the database betrays it, so verify-log passes; a writer that kept its head refuses the log and
// names both heads.
TEST_F(LogTest, WriterKeepingItsHeadRefusesARolledBackLog) {
  const std::string head_path = (dir_ / "log.head").string();
  std::string note6;
  Hash root4{};
  {
    auto log = Open();
    ASSERT_TRUE(log->KeepHeadIn(head_path).ok());  // no file yet: nothing remembered
    EXPECT_FALSE(std::filesystem::exists(head_path));
    for (int i = 0; i < 6; ++i) {
      auto r = log->Append(SampleEnvelope(*key_, i), *key_);
      ASSERT_TRUE(r.ok()) << r.status();
      auto kept = ReadHeadFile(head_path);  // every append leaves its checkpoint there
      ASSERT_TRUE(kept.ok() && *kept) << kept.status();
      EXPECT_EQ((*kept)->note, r->checkpoint);
      EXPECT_EQ((*kept)->head.size, r->tree_size);
      if (r->tree_size == 4) root4 = r->root;
      note6 = r->checkpoint;
    }
  }
  struct stat st;
  ASSERT_EQ(::stat(head_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const TreeHead head6 = *ParseCheckpoint(note6);

  ASSERT_EQ(RawDb(path_).DeleteTail(4), SQLITE_OK);
  ASSERT_TRUE(VerifyLogFile(path_, trust_).ok()) << AllProblems();  // the attack is invisible

  auto log = EvidenceLog::Open(path_, false);
  ASSERT_TRUE(log.ok());
  absl::Status refused = (*log)->KeepHeadIn(head_path);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("rolled back"));
  EXPECT_THAT(refused.message(), HasSubstr(DescribeHead(head6)));
  EXPECT_THAT(refused.message(), HasSubstr(DescribeHead({"", 4, root4})));
  EXPECT_THAT(refused.message(), HasSubstr(head_path));
  EXPECT_EQ(ReadHeadFile(head_path)->value().note, note6);  // the remembered head stays
}

// Rows deleted (or inserted) under a running writer: its next append is refused instead of
// handing out a record id a deleted record had, and the log stays as the attacker left it.
TEST_F(LogTest, WriterNeverReusesARecordIdAfterRowsChangeUnderIt) {
  auto log = Open();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(*key_, i), *key_).ok());
  ASSERT_EQ(RawDb(path_).DeleteTail(3), SQLITE_OK);
  auto next = log->Append(SampleEnvelope(*key_, 5), *key_);
  ASSERT_FALSE(next.ok()) << "appended as record " << next->seq;
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(next.status().message(), HasSubstr("holds 3 entries but this writer saw 5"));
  EXPECT_EQ(*log->Size(), 3u);
}

// A head file that cannot be written: the append that could not remember its head is done (it
// is committed), the next one is refused until the head can be written, then goes on.
TEST_F(LogTest, AppendsWaitForTheirHeadToBeRemembered) {
  std::filesystem::create_directory(dir_ / "state");
  const std::string head_path = (dir_ / "state" / "log.head").string();
  auto log = Open();
  ASSERT_TRUE(log->KeepHeadIn(head_path).ok());
  ASSERT_TRUE(log->Append(SampleEnvelope(*key_, 0), *key_).ok());
  std::filesystem::remove_all(dir_ / "state");  // fails even for root
  auto second = log->Append(SampleEnvelope(*key_, 1), *key_);
  ASSERT_TRUE(second.ok()) << second.status();
  auto third = log->Append(SampleEnvelope(*key_, 2), *key_);
  ASSERT_FALSE(third.ok());
  EXPECT_THAT(third.status().message(), HasSubstr("until the newest tree head is remembered"));
  EXPECT_EQ(*log->Size(), 2u);
  std::filesystem::create_directory(dir_ / "state");
  auto fourth = log->Append(SampleEnvelope(*key_, 2), *key_);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->seq, 2u);
  EXPECT_EQ(ReadHeadFile(head_path)->value().head.size, 3u);
}

// ckpt-auditd's check at start: adopt a log it has no head for after verifying it whole, adopt a
// longer consistent log (a crash between the append and the head write), refuse a rolled-back,
// forked or missing log naming both heads, and refuse a head file others can write.
TEST_F(LogTest, HeadAtStartAdoptsOrRefuses) {
  const std::string head_path = (dir_ / "log.head").string();
  EXPECT_TRUE(CheckHeadAtStart(path_, head_path, trust_)->message.empty());  // no log yet
  Fill(3);
  auto first = CheckHeadAtStart(path_, head_path, trust_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->adopted);
  EXPECT_THAT(first->message, HasSubstr("verified the whole log (3 entries)"));
  const SignedHead head3 = **ReadHeadFile(head_path);
  EXPECT_EQ(head3.note, EvidenceLog::OpenReadOnly(path_).value()->LatestCheckpoint()->second);
  auto same = CheckHeadAtStart(path_, head_path, trust_);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(same->adopted);

  {  // two appends whose head was never written
    auto log = Open();
    for (int i = 3; i < 5; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(*key_, i), *key_).ok());
  }
  auto longer = CheckHeadAtStart(path_, head_path, trust_);
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_TRUE(longer->adopted);
  EXPECT_THAT(longer->message, HasSubstr("extends the remembered head " +
                                         DescribeHead(head3.head)));
  const SignedHead head5 = **ReadHeadFile(head_path);
  EXPECT_EQ(head5.head.size, 5u);

  // A fork: the same origin and key, other entries, the same size.
  const std::string fork = (dir_ / "fork.db").string();
  {
    auto log = EvidenceLog::Open(fork, true, "test.example/log");
    for (int i = 10; i < 15; ++i) ASSERT_TRUE((*log)->Append(SampleEnvelope(*key_, i), *key_).ok());
  }
  auto forked = CheckHeadAtStart(fork, head_path, trust_);
  EXPECT_EQ(forked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(forked.status().message(), HasSubstr("forked"));
  EXPECT_THAT(forked.status().message(), HasSubstr(DescribeHead(head5.head)));
  auto fork_head = EvidenceLog::OpenReadOnly(fork).value()->RootAt(5);
  EXPECT_THAT(forked.status().message(), HasSubstr(DescribeHead({"", 5, *fork_head})));

  // A longer log of another history is not consistent with the head either.
  {
    auto log = EvidenceLog::Open(fork, false);
    ASSERT_TRUE((*log)->Append(SampleEnvelope(*key_, 15), *key_).ok());
  }
  EXPECT_THAT(CheckHeadAtStart(fork, head_path, trust_).status().message(),
              HasSubstr("not consistent"));

  ASSERT_EQ(RawDb(path_).DeleteTail(2), SQLITE_OK);
  auto rolled_back = CheckHeadAtStart(path_, head_path, trust_);
  EXPECT_EQ(rolled_back.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rolled_back.status().message(), HasSubstr("rolled back"));
  EXPECT_THAT(rolled_back.status().message(), HasSubstr(DescribeHead(head5.head)));
  EXPECT_THAT(rolled_back.status().message(), HasSubstr("size 2 root "));
  EXPECT_EQ((*ReadHeadFile(head_path))->note, head5.note);  // a refusal never rewrites it

  auto missing = CheckHeadAtStart((dir_ / "gone.db").string(), head_path, trust_);
  EXPECT_THAT(missing.status().message(), HasSubstr("no evidence database"));

  // Another log put in its place (another origin) is not the log whose head is remembered.
  const std::string other = (dir_ / "other.db").string();
  {
    auto log = EvidenceLog::Open(other, true, "other.example/log");
    for (int i = 0; i < 6; ++i) ASSERT_TRUE((*log)->Append(SampleEnvelope(*key_, i), *key_).ok());
  }
  auto replaced = CheckHeadAtStart(other, head_path, trust_);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(replaced.status().message(), HasSubstr("is not the remembered log's"));

  ASSERT_EQ(::chmod(head_path.c_str(), 0620), 0);
  auto loose = CheckHeadAtStart(path_, head_path, trust_);
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loose.status().message(),
              HasSubstr("tree head file is writable by group (mode 0620)"));
}

// A log that does not verify is never adopted: the daemon warns and remembers nothing.
TEST_F(LogTest, HeadAtStartNeverAdoptsALogThatDoesNotVerify) {
  Fill(3);
  RawDb db(path_);
  db.DropTriggers();
  const std::string head_path = (dir_ / "log.head").string();
  auto start = CheckHeadAtStart(path_, head_path, trust_);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_TRUE(start->warning);
  EXPECT_FALSE(start->adopted);
  EXPECT_THAT(start->message, HasSubstr("does not verify"));
  EXPECT_FALSE(std::filesystem::exists(head_path));
}

}  // namespace
}  // namespace ckpt::storage
