#include "storage/sqlite.h"

#include "absl/strings/str_cat.h"

namespace ckpt::storage {

absl::Status SqliteStatus(sqlite3* db, int rc, const std::string& label) {
  if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return absl::OkStatus();
  std::string msg = absl::StrCat(label, ": sqlite: ", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_IOERR:
      return absl::DataLossError(msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(msg);
    case SQLITE_CONSTRAINT:
      return absl::FailedPreconditionError(msg);
    case SQLITE_CANTOPEN:
      return absl::NotFoundError(msg);
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

Statement& Statement::operator=(Statement&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(stmt_);
    db_ = o.db_;
    stmt_ = o.stmt_;
    label_ = std::move(o.label_);
    o.stmt_ = nullptr;
  }
  return *this;
}

absl::StatusOr<Statement> Statement::Prepare(sqlite3* db, const std::string& sql,
                                             const std::string& label) {
  Statement s;
  s.db_ = db;
  s.label_ = label;
  int rc = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &s.stmt_, nullptr);
  if (rc != SQLITE_OK) return SqliteStatus(db, rc, label);
  return s;
}

Statement& Statement::Bind(int i, int64_t v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}

Statement& Statement::Bind(int i, const std::string& v) {
  sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

Statement& Statement::BindBlob(int i, std::span<const uint8_t> v) {
  sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

absl::StatusOr<bool> Statement::Step() {
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  absl::Status s = SqliteStatus(db_, rc, label_);
  sqlite3_reset(stmt_);
  return s;
}

absl::Status Statement::Run() {
  absl::StatusOr<bool> row;
  while ((row = Step()).ok() && *row) {
  }
  Reset();
  return row.status();
}

std::string Statement::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p),
                         static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
           : std::string();
}

std::span<const uint8_t> Statement::Blob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  return {static_cast<const uint8_t*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col))};
}

absl::Status Exec(sqlite3* db, const std::string& sql, const std::string& label) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteStatus(db, rc, label);
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

}  // namespace ckpt::storage
