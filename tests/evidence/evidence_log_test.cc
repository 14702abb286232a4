// The SQLite evidence log: appends, proofs, queries, append-only triggers, and verify-log
// catching each kind of tampering (the tests play the attacker through the sqlite3 C API).
#include "storage/evidence_log.h"

#include <filesystem>

#include "core/evidence/base64.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
  RawDb db(path_);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db.get(), "PRAGMA user_version", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), kLogSchemaVersion);
  sqlite3_finalize(st);
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
  by_time.since = "2026-01-03";
  by_time.until = "2026-01-05";  // days 3 and 4: i = 2, 3
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

TEST_F(LogTest, KeyRotationKeepsOldEntriesVerifiable) {
  Fill(3);  // records and checkpoints 1..3 signed by the old key
  auto next = *evidence::SigningKey::Generate();
  {
    auto log = Open();
    for (int i = 3; i < 6; ++i) ASSERT_TRUE(log->Append(SampleEnvelope(next, i), next).ok());
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
}

TEST_F(LogTest, RejectsEnvelopeThatIsNotEvidence) {
  auto log = Open();
  EXPECT_FALSE(log->Append("{}", *key_).ok());
  std::string not_statement =
      evidence::SignEnvelope("{\"x\":1}", evidence::kInTotoPayloadType, *key_);
  EXPECT_EQ(log->Append(not_statement, *key_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*log->Size(), 0u);
}

}  // namespace
}  // namespace ckpt::storage
