// Helpers for evidence log tests: signed sample records and raw SQLite access for tampering.
#ifndef CKPT_TESTS_EVIDENCE_LOG_TEST_UTIL_H_
#define CKPT_TESTS_EVIDENCE_LOG_TEST_UTIL_H_

#include <sqlite3.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/sha256.h"

namespace ckpt::testing {

// A signed evidence record for root "/models/m<i % roots>" with one file subject whose digest
// depends on i, so filters have something to tell apart.
inline std::string SampleEnvelope(const evidence::SigningKey& key, int i,
                                  const std::string& verdict = "pass", int roots = 3) {
  evidence::EvidenceRecord r;
  r.root = absl::StrCat("/models/m", i % roots);
  std::string name = absl::StrCat("file-", i);
  r.subjects = {{"model.safetensors", ToHex(Sha256Of({reinterpret_cast<const uint8_t*>(
                                                          name.data()),
                                                      name.size()}))}};
  r.policy = {i % 2 ? "strict" : "default", "1", {{"max_span", 17}}};
  evidence::CheckResult c;
  c.name = "file_digests";
  c.verdict = verdict == "pass" ? evidence::Verdict::kPass : evidence::Verdict::kFail;
  c.counts["files"] = 1;
  r.checks.push_back(c);
  r.started_at = absl::StrFormat("2026-01-%02dT00:00:00.000Z", 1 + i % 28);
  r.finished_at = absl::StrFormat("2026-01-%02dT00:00:01.000Z", 1 + i % 28);
  return *evidence::SignEnvelope(*evidence::RecordPayload(r), evidence::kInTotoPayloadType, key);
}

// A raw connection for tests that play the attacker.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    sqlite3_open(path.c_str(), &db_);
    sqlite3_busy_timeout(db_, 10000);  // a live daemon may be writing a job row
  }
  ~RawDb() { sqlite3_close(db_); }
  // Returns the SQLite result code and leaves the error message in error().
  int Exec(const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    error_ = err ? err : "";
    sqlite3_free(err);
    return rc;
  }
  void DropTriggers() {
    for (const char* t : {"meta", "entries", "subjects", "tree_nodes", "checkpoints"}) {
      for (const char* op : {"UPDATE", "DELETE"}) {
        Exec(absl::StrCat("DROP TRIGGER ", t, "_no_", op));
      }
    }
  }
  // The rollback attack: removes entries from seq `n` on with their subject rows, the tree
  // nodes they finished and the checkpoints that cover them, as the file's owner can: the DELETE
  // triggers are dropped for it and created again as they were, so the log keeps every trigger
  // verify-log looks for. SQLITE_OK when every statement ran.
  int DeleteTail(uint64_t n) {
    constexpr const char* kTables[] = {"entries", "subjects", "tree_nodes", "checkpoints"};
    std::string sql;
    for (const char* t : kTables) absl::StrAppend(&sql, "DROP TRIGGER ", t, "_no_DELETE;");
    absl::StrAppend(&sql, "DELETE FROM subjects WHERE seq >= ", n, ";",
                    "DELETE FROM entries WHERE seq >= ", n, ";",
                    "DELETE FROM tree_nodes WHERE ((idx + 1) << level) > ", n, ";",
                    "DELETE FROM checkpoints WHERE size > ", n, ";");
    for (const char* t : kTables) {
      absl::StrAppend(&sql, "CREATE TRIGGER ", t, "_no_DELETE BEFORE DELETE ON ", t,
                      " BEGIN SELECT RAISE(ABORT, 'evidence log is append-only: DELETE on ", t,
                      " refused'); END;");
    }
    return Exec(absl::StrCat("BEGIN;", sql, "COMMIT;"));
  }
  void SetBlob(const std::string& sql, const std::string& blob) {
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr);
    sqlite3_bind_blob(st, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    sqlite3_step(st);
    sqlite3_finalize(st);
  }
  const std::string& error() const { return error_; }
  sqlite3* get() { return db_; }

 private:
  sqlite3* db_ = nullptr;
  std::string error_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_EVIDENCE_LOG_TEST_UTIL_H_
