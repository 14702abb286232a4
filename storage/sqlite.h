// Thin RAII wrappers over the SQLite C API that turn result codes into absl::Status.
//
// Corruption (SQLITE_CORRUPT, SQLITE_NOTADB) maps to DATA_LOSS, a busy database to UNAVAILABLE,
// constraint and trigger aborts to FAILED_PRECONDITION; messages start with the database path.
#ifndef CKPT_STORAGE_SQLITE_H_
#define CKPT_STORAGE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::storage {

absl::Status SqliteStatus(sqlite3* db, int rc, const std::string& label);

class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(Statement&& o) noexcept : db_(o.db_), stmt_(o.stmt_), label_(std::move(o.label_)) {
    o.stmt_ = nullptr;
  }
  Statement& operator=(Statement&& o) noexcept;

  static absl::StatusOr<Statement> Prepare(sqlite3* db, const std::string& sql,
                                           const std::string& label);

  Statement& Bind(int i, int64_t v);
  Statement& Bind(int i, const std::string& v);
  Statement& BindBlob(int i, std::span<const uint8_t> v);
  // Next row: true when a row is available, false when done.
  absl::StatusOr<bool> Step();
  // Runs to completion, expecting no rows.
  absl::Status Run();
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const;
  std::span<const uint8_t> Blob(int col) const;

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  std::string label_;
};

// Rolls back the transaction open on `db` when it goes out of scope, unless Committed() was
// called after a successful COMMIT.
class RollbackGuard {
 public:
  explicit RollbackGuard(sqlite3* db) : db_(db) {}
  ~RollbackGuard() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  RollbackGuard(const RollbackGuard&) = delete;
  RollbackGuard& operator=(const RollbackGuard&) = delete;
  void Committed() { done_ = true; }

 private:
  sqlite3* db_;
  bool done_ = false;
};

// Runs one or more statements that return no rows.
absl::Status Exec(sqlite3* db, const std::string& sql, const std::string& label);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SQLITE_H_
