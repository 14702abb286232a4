#include "storage/evidence_log.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/civil_time.h"
#include "absl/time/clock.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "storage/head_state.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::storage {
namespace {

// Schema version 1. Every table is STRICT; the triggers make the log append-only.
constexpr char kSchemaV1[] = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE entries(
  seq INTEGER PRIMARY KEY,
  envelope BLOB NOT NULL,
  leaf_hash BLOB NOT NULL,
  predicate_type TEXT NOT NULL,
  keyid TEXT NOT NULL,
  root_path TEXT NOT NULL,
  policy TEXT NOT NULL,
  verdict TEXT NOT NULL,
  audit_time TEXT NOT NULL
) STRICT;
CREATE INDEX entries_root ON entries(root_path, seq);
CREATE INDEX entries_policy ON entries(policy, seq);
CREATE INDEX entries_verdict ON entries(verdict, seq);
CREATE INDEX entries_time ON entries(audit_time);
CREATE INDEX entries_leaf ON entries(leaf_hash);
CREATE TABLE subjects(
  seq INTEGER NOT NULL REFERENCES entries(seq),
  name TEXT NOT NULL,
  sha256 TEXT NOT NULL
) STRICT;
CREATE INDEX subjects_digest ON subjects(sha256, seq);
CREATE INDEX subjects_seq ON subjects(seq);
CREATE TABLE tree_nodes(
  level INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  hash BLOB NOT NULL,
  PRIMARY KEY(level, idx)
) STRICT, WITHOUT ROWID;
CREATE TABLE checkpoints(size INTEGER PRIMARY KEY, note TEXT NOT NULL) STRICT;
)sql";

// Schema version 2: durable daemon jobs, and INSERT triggers that keep the index tables tied to
// the entry being appended (defence in depth: readers that matter verify payloads, never these
// rows). `jobs` is the one updatable table: a job's state changes; its id and request do not, and
// no job row is ever deleted. Nothing signed is read from it.
constexpr char kSchemaV2[] = R"sql(
CREATE TABLE jobs(
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  root TEXT NOT NULL,
  source_root TEXT NOT NULL,
  policy TEXT NOT NULL,
  root_map TEXT NOT NULL,
  invoker TEXT NOT NULL,
  state TEXT NOT NULL CHECK(state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled',
                                      'interrupted')),
  verdict TEXT NOT NULL,
  record_id INTEGER NOT NULL,
  error_code INTEGER NOT NULL,
  error_message TEXT NOT NULL,
  created_at TEXT NOT NULL,
  finished_at TEXT NOT NULL
) STRICT;
CREATE INDEX jobs_state ON jobs(state, seq);
CREATE TRIGGER jobs_no_DELETE BEFORE DELETE ON jobs
  BEGIN SELECT RAISE(ABORT, 'jobs are kept: DELETE on jobs refused'); END;
CREATE TRIGGER jobs_request_fixed
  BEFORE UPDATE OF seq, id, root, source_root, policy, root_map, invoker, created_at ON jobs
  BEGIN SELECT RAISE(ABORT, 'a job''s id and request are fixed'); END;
CREATE TRIGGER entries_in_order BEFORE INSERT ON entries
  WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq) + 1, 0) FROM entries)
  BEGIN SELECT RAISE(ABORT, 'evidence log: entries are appended in seq order'); END;
CREATE TRIGGER subjects_of_newest BEFORE INSERT ON subjects
  WHEN NEW.seq IS NOT (SELECT MAX(seq) FROM entries)
  BEGIN SELECT RAISE(ABORT, 'evidence log: subject rows belong to the entry being appended'); END;
CREATE TRIGGER tree_nodes_of_newest BEFORE INSERT ON tree_nodes
  WHEN ((NEW.idx + 1) << NEW.level) IS NOT (SELECT MAX(seq) + 1 FROM entries)
  BEGIN SELECT RAISE(ABORT, 'evidence log: tree nodes end at the entry being appended'); END;
CREATE TRIGGER checkpoints_of_size BEFORE INSERT ON checkpoints
  WHEN NEW.size IS NOT (SELECT COALESCE(MAX(seq) + 1, 0) FROM entries)
  BEGIN SELECT RAISE(ABORT, 'evidence log: a checkpoint covers every entry'); END;
)sql";

// Schema version 3: a job's block forward request (docs/daemon.md), fixed like the rest of it.
constexpr char kSchemaV3[] = R"sql(
ALTER TABLE jobs ADD COLUMN forward_layers TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN device TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN emulate TEXT NOT NULL DEFAULT '';
DROP TRIGGER jobs_request_fixed;
CREATE TRIGGER jobs_request_fixed
  BEFORE UPDATE OF seq, id, root, source_root, policy, root_map, invoker, created_at,
                   forward_layers, device, emulate ON jobs
  BEGIN SELECT RAISE(ABORT, 'a job''s id and request are fixed'); END;
)sql";

// Schema version 4: each job row's authentication code over its request (storage/job_table.h),
// fixed like the request, and how often a restart interrupted the job (docs/daemon.md).
constexpr char kSchemaV4[] = R"sql(
ALTER TABLE jobs ADD COLUMN mac TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN interruptions INTEGER NOT NULL DEFAULT 0;
DROP TRIGGER jobs_request_fixed;
CREATE TRIGGER jobs_request_fixed
  BEFORE UPDATE OF seq, id, root, source_root, policy, root_map, invoker, created_at,
                   forward_layers, device, emulate, mac ON jobs
  BEGIN SELECT RAISE(ABORT, 'a job''s id and request are fixed'); END;
)sql";

// Schema version 5: how many parts a job on the Slurm executor splits into (0: the daemon runs it
// itself), fixed like the rest of the request, and the executor's id of the job running it (a
// Slurm array job id), updated as it is submitted (docs/daemon.md "Slurm executor").
constexpr char kSchemaV5[] = R"sql(
ALTER TABLE jobs ADD COLUMN parts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN executor_job TEXT NOT NULL DEFAULT '';
DROP TRIGGER jobs_request_fixed;
CREATE TRIGGER jobs_request_fixed
  BEFORE UPDATE OF seq, id, root, source_root, policy, root_map, invoker, created_at,
                   forward_layers, device, emulate, mac, parts ON jobs
  BEGIN SELECT RAISE(ABORT, 'a job''s id and request are fixed'); END;
)sql";

// Schema version 6: the OCI referrers ckpt-auditd --attach pushed for a job's record (state,
// like the outcome; docs/daemon.md "OCI subjects").
constexpr char kSchemaV6[] = R"sql(
ALTER TABLE jobs ADD COLUMN referrers TEXT NOT NULL DEFAULT '';
)sql";

constexpr const char* kAppendOnlyTables[] = {"meta", "entries", "subjects", "tree_nodes",
                                             "checkpoints"};

std::string TriggerSql() {
  std::string sql;
  for (const char* t : kAppendOnlyTables) {
    for (const char* op : {"UPDATE", "DELETE"}) {
      absl::StrAppend(&sql, "CREATE TRIGGER ", t, "_no_", op, " BEFORE ", op, " ON ", t,
                      " BEGIN SELECT RAISE(ABORT, 'evidence log is append-only: ", op, " on ", t,
                      " refused'); END;\n");
    }
  }
  return sql;
}

std::string RandomOrigin() {
  uint8_t bytes[8];
  RAND_bytes(bytes, sizeof(bytes));
  return absl::StrCat("ckpt-audit.local/", ToHex(bytes));
}

Hash ToHash(std::span<const uint8_t> b) {
  Hash h{};
  if (b.size() == h.size()) std::memcpy(h.data(), b.data(), h.size());
  return h;
}

std::string ErrnoText(int err) { return std::strerror(err); }

// OK when `path` (which exists) can be opened for writing; otherwise why not. A file with no
// write bit is read-only by intent even for root, who could write it anyway.
absl::Status WritableStatus(const std::string& path, const std::string& label) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::OkStatus();
  if ((st.st_mode & 0222) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": the database file has no write permission"));
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        label, err == EROFS ? ": read-only filesystem" : ": cannot open for writing: ",
        err == EROFS ? "" : ErrnoText(err)));
  }
  ::close(fd);
  return absl::OkStatus();
}

// The writer lock: an exclusive flock on "<db>.lock" (created 0600), holding the owner's pid.
// FAILED_PRECONDITION when another writer holds it; another error when the lock file cannot be
// created (a read-only directory: the caller then opens the log read-only).
absl::StatusOr<int> TakeWriterLock(const std::string& path, const std::string& label) {
  std::string lock_path = path + ".lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(label, ": cannot create the writer lock file: ", ErrnoText(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    char holder[32] = {0};
    ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat(label, ": flock: ", ErrnoText(err)));
    }
    std::string pid = n > 0 ? std::string(absl::StripAsciiWhitespace(holder)) : "?";
    return absl::FailedPreconditionError(absl::StrCat(
        label, ": another writer (pid ", pid,
        ") has this evidence log open; one ckpt-auditd or ckpt-audit writer at a time"));
  }
  std::string me = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The pid is only a diagnostic for the next writer; the lock itself is held.
  }
  return fd;
}

// SQLite URI filename for `path`: every byte outside a safe set percent-encoded.
std::string UriPath(const std::string& path) {
  std::string out = "file:";
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '.' || c == '_' || c == '-' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, absl::StrFormat("%%%02x", c));
    }
  }
  return out;
}

bool NonEmptyFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EvidenceLog>> EvidenceLog::OpenConnection(
    const std::string& path, const std::string& label, bool read_only, bool immutable,
    int lock_fd) {
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI |
              (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE);
  std::string uri = UriPath(path);
  if (read_only) absl::StrAppend(&uri, immutable ? "?mode=ro&immutable=1" : "?mode=ro");
  int rc = sqlite3_open_v2(uri.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteStatus(db, rc, label);
    sqlite3_close(db);
    if (lock_fd >= 0) ::close(lock_fd);
    return s;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, 10000);
  return std::unique_ptr<EvidenceLog>(new EvidenceLog(path, label, db, lock_fd));
}

absl::StatusOr<std::unique_ptr<EvidenceLog>> EvidenceLog::OpenReadOnly(const std::string& path,
                                                                       const std::string& label) {
  std::string name = label.empty() ? path : label;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(name, ": no evidence database"));
  }
  absl::Status first;
  for (bool immutable : {false, true}) {
    // Immutable mode skips the WAL, so it is exact only when there is no WAL to read.
    if (immutable && NonEmptyFile(path + "-wal")) break;
    auto log = OpenConnection(path, name, /*read_only=*/true, immutable, -1);
    if (!log.ok()) return log.status();
    absl::Status s = (*log)->ReadOrigin();
    if (s.ok()) {
      (*log)->append_status_ =
          absl::FailedPreconditionError(absl::StrCat(name, ": opened read-only"));
      return log;
    }
    if (first.ok()) first = s;
  }
  return first;
}

absl::StatusOr<std::unique_ptr<EvidenceLog>> EvidenceLog::Open(const std::string& path,
                                                               const LogOpenOptions& options) {
  const std::string label = options.label.empty() ? path : options.label;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (!options.create) return absl::NotFoundError(absl::StrCat(label, ": no evidence database"));
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat(label, ": cannot create the database: ", ErrnoText(errno)));
    }
    if (fd >= 0) ::close(fd);
  }
  absl::Status writable = WritableStatus(path, label);
  int lock_fd = -1;
  if (writable.ok()) {
    auto lock = TakeWriterLock(path, label);
    if (!lock.ok() && lock.status().code() == absl::StatusCode::kFailedPrecondition) {
      return lock.status();
    }
    if (lock.ok()) lock_fd = *lock;
    else writable = lock.status();
  }
  if (!writable.ok()) {
    auto log = OpenReadOnly(path, label);
    if (!log.ok()) return log.status();
    (*log)->append_status_ = absl::FailedPreconditionError(
        absl::StrCat(writable.message(), "; opened read-only (queries and verification only)"));
    return log;
  }
  auto log = OpenConnection(path, label, /*read_only=*/false, false, lock_fd);
  if (!log.ok()) return log.status();
  if (auto s = (*log)->Configure(options.create, options.origin); !s.ok()) return s;
  return log;
}

EvidenceLog::~EvidenceLog() {
  node_stmt_.reset();
  entry_stmt_.reset();
  subject_stmt_.reset();
  insert_node_stmt_.reset();
  get_stmt_.reset();
  latest_checkpoint_stmt_.reset();
  query_stmts_.clear();
  sqlite3_close(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the writer lock
}

absl::StatusOr<Statement> EvidenceLog::Prepare(const std::string& sql) const {
  return Statement::Prepare(db_, sql, label_);
}

absl::StatusOr<Statement*> EvidenceLog::Cached(std::optional<Statement>& slot,
                                               const char* sql) const {
  if (!slot) {
    auto s = Prepare(sql);
    if (!s.ok()) return s.status();
    slot = std::move(*s);
  }
  return &*slot;
}

absl::StatusOr<Statement*> EvidenceLog::CachedQuery(const std::string& sql) const {
  // Query builds its text from fixed clauses, so few distinct texts exist; the bound is a guard.
  constexpr size_t kMaxQueryStatements = 64;
  auto it = query_stmts_.find(sql);
  if (it == query_stmts_.end()) {
    auto s = Prepare(sql);
    if (!s.ok()) return s.status();
    if (query_stmts_.size() >= kMaxQueryStatements) query_stmts_.clear();
    it = query_stmts_.emplace(sql, *std::move(s)).first;
  }
  return &it->second;
}

absl::Status EvidenceLog::Configure(bool create, const std::string& origin) {
  // journal_mode answers with a row, so it goes through Exec (which ignores rows).
  if (auto s = Exec(db_,
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"
                    " PRAGMA recursive_triggers=ON; PRAGMA wal_autocheckpoint=8192;",
                    label_);
      !s.ok()) {
    return s;
  }
  // A damaged file is never appended to: a new entry would be signed over a tree SQLite can no
  // longer read reliably. It still serves reads and verification, which report the damage.
  auto check = IntegrityCheck(/*quick=*/true);
  if (!check.ok() || *check != "ok") {
    std::string what = check.ok() ? *check : std::string(check.status().message());
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    append_status_ = absl::DataLossError(absl::StrCat(
        label_, ": PRAGMA quick_check failed at open (", what,
        "); appends are refused, reads and verification still work"));
    return ReadOrigin();
  }
  if (auto s = Migrate(); !s.ok()) return s;
  absl::Status read = ReadOrigin();
  if (!read.ok() && absl::IsDataLoss(read) && create) {
    // A fresh database: fix its origin once; the meta triggers keep it.
    auto put = Prepare("INSERT OR IGNORE INTO meta(key, value) VALUES('origin', ?)");
    if (!put.ok()) return put.status();
    put->Bind(1, origin.empty() ? RandomOrigin() : origin);
    if (auto s = put->Run(); !s.ok()) return s;
    read = ReadOrigin();
  }
  if (!read.ok()) return read;
  auto size = Size();  // under the writer lock: only this writer appends from now on
  if (!size.ok()) return size.status();
  size_ = *size;
  return absl::OkStatus();
}

absl::Status EvidenceLog::ReadOrigin() {
  auto version = SchemaVersion();
  if (!version.ok()) return version.status();
  schema_version_ = *version;
  if (schema_version_ > kLogSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(label_, ": schema version ", schema_version_,
                                                      " is newer than this tool's ",
                                                      kLogSchemaVersion));
  }
  if (schema_version_ < 1) return absl::DataLossError(absl::StrCat(label_, ": log has no origin"));
  auto get = Prepare("SELECT value FROM meta WHERE key = 'origin'");
  if (!get.ok()) return get.status();
  auto row = get->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::DataLossError(absl::StrCat(label_, ": log has no origin"));
  origin_ = get->Text(0);
  return absl::OkStatus();
}

absl::Status EvidenceLog::InReadTransaction(const std::function<absl::Status()>& fn) const {
  if (auto s = Exec(db_, "BEGIN DEFERRED", label_); !s.ok()) return s;
  absl::Status result = fn();
  // A read transaction changes nothing, so it ends with ROLLBACK, which (unlike COMMIT) also
  // succeeds after a statement in it hit a damaged page.
  sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return result;
}

absl::Status EvidenceLog::KeepHeadIn(const std::string& path) {
  auto remembered = ReadHeadFile(path);
  if (!remembered.ok()) return remembered.status();
  if (*remembered) {
    absl::Status s = InReadTransaction([&]() -> absl::Status {
      auto stored = StoredHead(*this);
      if (!stored.ok()) return stored.status();
      return CheckExtends(*this, (*remembered)->head, *stored);
    });
    if (!s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(label_, ": ", s.message(), "; the verified head is remembered in ", path));
    }
  }
  head_path_ = path;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EvidenceLog::SchemaVersion() const {
  auto v = Prepare("PRAGMA user_version");
  if (!v.ok()) return v.status();
  auto row = v->Step();
  if (!row.ok()) return row.status();
  return v->Int(0);
}

absl::Status EvidenceLog::Migrate() {
  // Current logs need no write lock just to be opened (query, report, verify-log).
  auto current = SchemaVersion();
  if (!current.ok()) return current.status();
  if (*current == kLogSchemaVersion) return absl::OkStatus();
  if (auto s = Exec(db_, "BEGIN IMMEDIATE", label_); !s.ok()) return s;
  RollbackGuard tx(db_);
  auto locked = SchemaVersion();  // another process may have migrated meanwhile
  if (!locked.ok()) return locked.status();
  int64_t version = *locked;
  if (version > kLogSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        label_, ": schema version ", version, " is newer than this tool's ", kLogSchemaVersion));
  }
  // Each step takes the schema from version N to N+1; older logs run every step after theirs.
  if (version < 1) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV1, TriggerSql(), "PRAGMA user_version = 1;"),
                      label_);
        !s.ok()) {
      return s;
    }
  }
  if (version < 2) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV2, "PRAGMA user_version = 2;"), label_); !s.ok()) {
      return s;
    }
  }
  if (version < 3) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV3, "PRAGMA user_version = 3;"), label_); !s.ok()) {
      return s;
    }
  }
  if (version < 4) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV4, "PRAGMA user_version = 4;"), label_); !s.ok()) {
      return s;
    }
  }
  if (version < 5) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV5, "PRAGMA user_version = 5;"), label_); !s.ok()) {
      return s;
    }
  }
  if (version < 6) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV6, "PRAGMA user_version = 6;"), label_); !s.ok()) {
      return s;
    }
  }
  if (auto s = Exec(db_, "COMMIT", label_); !s.ok()) return s;
  tx.Committed();
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> EvidenceLog::Append(const std::string& envelope,
                                                 const evidence::SigningKey& log_key,
                                                 const evidence::SigningKey* previous_key) {
  return AppendBatch({envelope}, log_key, previous_key);
}

absl::StatusOr<AppendResult> EvidenceLog::AppendBatch(const std::vector<std::string>& envelopes,
                                                      const evidence::SigningKey& log_key,
                                                      const evidence::SigningKey* previous_key) {
  if (envelopes.empty()) return absl::InvalidArgumentError("nothing to append");
  if (!append_status_.ok()) return append_status_;
  if (!unsaved_head_.empty()) {
    if (auto s = WriteHeadFile(head_path_, unsaved_head_); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          label_, ": appends wait until the newest tree head is remembered: ", s.message()));
    }
    unsaved_head_.clear();
  }
  // IMMEDIATE takes the write lock now, so two appenders never both read the same size.
  if (auto s = Exec(db_, "BEGIN IMMEDIATE", label_); !s.ok()) return s;
  RollbackGuard tx(db_);
  auto result = AppendLocked(envelopes, log_key, previous_key);
  if (!result.ok()) return result.status();
  if (auto s = Exec(db_, "COMMIT", label_); !s.ok()) return s;
  tx.Committed();
  size_ = result->tree_size;
  // The append is done whatever happens to the head file; the next one retries the write.
  if (!head_path_.empty() && !WriteHeadFile(head_path_, result->checkpoint).ok()) {
    unsaved_head_ = result->checkpoint;
  }
  return result;
}

absl::Status EvidenceLog::OtherKey(uint64_t size, const evidence::SigningKey& log_key) const {
  // The key that signed the latest entry, as its envelope names it (the writer signs both).
  std::string other = "another key";
  if (auto entry = Get(size - 1); entry.ok()) {
    if (auto env = evidence::ParseEnvelope(entry->envelope); env.ok() && !env->signatures.empty()) {
      other = absl::StrCat("key ", env->signatures[0].keyid, " (which signed entry ", size - 1,
                           ")");
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      label_, ": its checkpoints are signed by ", other, ", not by key ",
      log_key.public_key().KeyId(), " that would sign this append; a log is signed by one key, "
      "or no trust file verifies it. Nothing was appended: give that log's key (--key), or use "
      "another log (--db)"));
}

absl::StatusOr<bool> EvidenceLog::SignsLatest(uint64_t size,
                                              const evidence::SigningKey& key) const {
  if (size == 0) return true;
  auto latest = LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  evidence::TrustStore own;
  own.Add(key.public_key());
  return VerifyCheckpoint(latest->second, origin_, own).ok();
}

absl::StatusOr<AppendResult> EvidenceLog::AppendLocked(const std::vector<std::string>& envelopes,
                                                       const evidence::SigningKey& log_key,
                                                       const evidence::SigningKey* previous_key) {
  auto size = Size();
  if (!size.ok()) return size.status();
  if (*size != size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        label_, ": the log holds ", *size, " entries but this writer saw ", size_,
        "; another process changed it, so nothing is appended (a record id is never reused)"));
  }
  // One key signs a log's checkpoints (docs/evidence.md, "One key per log"): the latest must be
  // this key's, or, for a rotation, the previous key's, which then cosigns the new one.
  auto mine = SignsLatest(*size, log_key);
  if (!mine.ok()) return mine.status();
  bool cosign = false;
  if (!*mine) {
    auto previous = previous_key == nullptr ? absl::StatusOr<bool>(false)
                                            : SignsLatest(*size, *previous_key);
    if (!previous.ok()) return previous.status();
    if (!*previous) return OtherKey(*size, log_key);
    cosign = true;
  }
  uint64_t seq = *size;
  for (const std::string& env : envelopes) {
    if (auto s = InsertOne(seq, env); !s.ok()) return s;
    ++seq;
  }
  AppendResult r;
  r.seq = seq - 1;
  r.tree_size = seq;
  auto root = RootAt(seq);
  if (!root.ok()) return root.status();
  r.root = *root;
  auto checkpoint = SignCheckpoint({origin_, seq, r.root}, log_key);
  if (!checkpoint.ok()) return checkpoint.status();  // the transaction rolls back
  if (cosign) {
    auto handover = SignCheckpoint({origin_, seq, r.root}, *previous_key);
    if (!handover.ok()) return handover.status();
    *checkpoint += handover->substr(handover->find("\n\n") + 2);  // its signature line
  }
  r.checkpoint = *std::move(checkpoint);
  auto put = Prepare("INSERT INTO checkpoints(size, note) VALUES(?, ?)");
  if (!put.ok()) return put.status();
  put->Bind(1, static_cast<int64_t>(seq)).Bind(2, r.checkpoint);
  if (auto s = put->Run(); !s.ok()) return s;
  return r;
}

absl::Status EvidenceLog::InsertOne(uint64_t seq, const std::string& envelope) {
  auto env = evidence::ParseEnvelope(envelope);
  if (!env.ok()) return env.status();
  if (env->signatures.empty()) return absl::InvalidArgumentError("envelope is not signed");
  auto idx = evidence::IndexPayload(env->payload);
  if (!idx.ok()) return idx.status();
  Hash leaf = LeafHash(evidence::AsBytes(envelope));
  auto ins = Cached(entry_stmt_,
      "INSERT INTO entries(seq, envelope, leaf_hash, predicate_type, keyid, root_path, policy,"
      " verdict, audit_time) VALUES(?,?,?,?,?,?,?,?,?)");
  if (!ins.ok()) return ins.status();
  (*ins)->Bind(1, static_cast<int64_t>(seq))
      .BindBlob(2, evidence::AsBytes(envelope))
      .BindBlob(3, leaf)
      .Bind(4, idx->predicate_type)
      .Bind(5, env->signatures[0].keyid)
      .Bind(6, idx->root)
      .Bind(7, idx->policy)
      .Bind(8, idx->verdict)
      .Bind(9, idx->time);
  if (auto s = (*ins)->Run(); !s.ok()) return s;
  auto sub = Cached(subject_stmt_, "INSERT INTO subjects(seq, name, sha256) VALUES(?,?,?)");
  if (!sub.ok()) return sub.status();
  for (const evidence::Subject& s : idx->subjects) {
    (*sub)->Bind(1, static_cast<int64_t>(seq)).Bind(2, s.name).Bind(3, s.sha256);
    if (auto st = (*sub)->Run(); !st.ok()) return st;
  }
  // Store the leaf and every complete subtree it finishes (the right spine while idx is odd).
  auto node = Cached(insert_node_stmt_, "INSERT INTO tree_nodes(level, idx, hash) VALUES(?,?,?)");
  if (!node.ok()) return node.status();
  Hash h = leaf;
  uint64_t i = seq;
  for (int level = 0;; ++level) {
    (*node)->Bind(1, level).Bind(2, static_cast<int64_t>(i)).BindBlob(3, h);
    if (auto s = (*node)->Run(); !s.ok()) return s;
    if ((i & 1) == 0) break;
    auto left = Node(level, i - 1);
    if (!left.ok()) return left.status();
    h = NodeHash(*left, h);
    i >>= 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> EvidenceLog::FindByLeafHash(const Hash& leaf) const {
  auto q = Prepare("SELECT seq FROM entries WHERE leaf_hash = ? ORDER BY seq LIMIT 1");
  if (!q.ok()) return q.status();
  q->BindBlob(1, leaf);
  auto row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(label_, ": record is not in this log"));
  return static_cast<uint64_t>(q->Int(0));
}

absl::StatusOr<uint64_t> EvidenceLog::Size() const {
  auto q = Prepare("SELECT COALESCE(MAX(seq) + 1, 0) FROM entries");
  if (!q.ok()) return q.status();
  auto row = q->Step();
  if (!row.ok()) return row.status();
  return static_cast<uint64_t>(q->Int(0));
}

namespace {
// Resets a cached statement (and clears its bindings) however the function using it returns.
class ResetOnExit {
 public:
  explicit ResetOnExit(Statement& q) : q_(q) {}
  ~ResetOnExit() { q_.Reset(); }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  Statement& q_;
};

constexpr char kEntryColumns[] =
    "seq, envelope, leaf_hash, predicate_type, keyid, root_path, policy, verdict, audit_time";

LogEntry ReadEntry(const Statement& q) {
  LogEntry e;
  e.seq = static_cast<uint64_t>(q.Int(0));
  auto env = q.Blob(1);
  e.envelope.assign(reinterpret_cast<const char*>(env.data()), env.size());
  e.leaf_hash = ToHash(q.Blob(2));
  e.predicate_type = q.Text(3);
  e.keyid = q.Text(4);
  e.root = q.Text(5);
  e.policy = q.Text(6);
  e.verdict = q.Text(7);
  e.time = q.Text(8);
  return e;
}
}  // namespace

absl::StatusOr<LogEntry> EvidenceLog::Get(uint64_t seq) const {
  static const std::string kSql =
      absl::StrCat("SELECT ", kEntryColumns, " FROM entries WHERE seq = ?");
  auto q = Cached(get_stmt_, kSql.c_str());
  if (!q.ok()) return q.status();
  ResetOnExit reset(**q);
  (*q)->Bind(1, static_cast<int64_t>(seq));
  auto row = (*q)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(label_, ": no record ", seq));
  return ReadEntry(**q);
}

namespace {

// Every record's time is written by evidence::Rfc3339Now in one canonical UTC form
// ("2026-01-02T03:04:05.678Z"), so a time converted to that form compares as text exactly as
// the times compare. Sub-millisecond parts round up: stored times are whole milliseconds.
// nullopt when `t` lies beyond what the form can write (year > 9999).
std::optional<std::string> CanonicalTime(absl::Time t) {
  static const absl::Time kFirst = absl::FromCivil(absl::CivilSecond(1, 1, 1), absl::UTCTimeZone());
  static const absl::Time kLast =
      absl::FromCivil(absl::CivilSecond(9999, 12, 31, 23, 59, 59), absl::UTCTimeZone()) +
      absl::Milliseconds(999);
  if (t < kFirst) t = kFirst;
  if (t > kLast) return std::nullopt;
  absl::Duration since_epoch = absl::Ceil(t - absl::UnixEpoch(), absl::Milliseconds(1));
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::UnixEpoch() + since_epoch,
                          absl::UTCTimeZone());
}

}  // namespace

absl::StatusOr<QueryPage> EvidenceLog::Query(const QueryFilter& f) const {
  if (f.limit <= 0 || f.limit > 10000) {
    return absl::InvalidArgumentError("query limit must be in 1..10000");
  }
  std::string sql = absl::StrCat("SELECT ", kEntryColumns, " FROM entries WHERE 1");
  std::vector<std::string> texts;
  auto add = [&](const std::string& value, const char* clause) {
    if (value.empty()) return;
    absl::StrAppend(&sql, " AND ", clause);
    texts.push_back(value);
  };
  add(f.digest, "seq IN (SELECT seq FROM subjects WHERE sha256 = ?)");
  add(f.root, "root_path = ?");
  add(f.verdict, "verdict = ?");
  add(f.policy, "policy = ?");
  add(f.predicate_type, "predicate_type = ?");
  if (f.since) {
    std::optional<std::string> since = CanonicalTime(*f.since);
    if (!since) return QueryPage{};  // after every time a record can carry
    add(*since, "audit_time >= ?");
  }
  if (f.until) {
    // An entry without a time (a test result) is not "before" any time.
    if (std::optional<std::string> until = CanonicalTime(*f.until)) {
      add(*until, "audit_time <> '' AND audit_time < ?");
    } else {
      absl::StrAppend(&sql, " AND audit_time <> ''");
    }
  }
  int64_t before = -1;
  if (!f.page_token.empty()) {
    if (!absl::SimpleAtoi(f.page_token, &before) || before < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad page token '", f.page_token, "'"));
    }
    absl::StrAppend(&sql, " AND seq < ?");
  }
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ?");
  auto cached = CachedQuery(sql);
  if (!cached.ok()) return cached.status();
  Statement& q = **cached;
  ResetOnExit reset(q);
  int i = 1;
  for (const std::string& t : texts) q.Bind(i++, t);
  if (before >= 0) q.Bind(i++, before);
  q.Bind(i, f.limit + 1);  // one more row tells whether another page exists
  QueryPage page;
  absl::StatusOr<bool> row;
  while ((row = q.Step()).ok() && *row) {
    if (page.entries.size() == static_cast<size_t>(f.limit)) {
      page.next_page_token = absl::StrCat(page.entries.back().seq);
      break;
    }
    page.entries.push_back(ReadEntry(q));
  }
  if (!row.ok()) return row.status();
  return page;
}

absl::StatusOr<std::pair<uint64_t, std::string>> EvidenceLog::LatestCheckpoint() const {
  auto q = Cached(latest_checkpoint_stmt_,
                  "SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1");
  if (!q.ok()) return q.status();
  ResetOnExit reset(**q);
  auto row = (*q)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(label_, ": log is empty"));
  return std::make_pair(static_cast<uint64_t>((*q)->Int(0)), (*q)->Text(1));
}

absl::StatusOr<Hash> EvidenceLog::Node(int level, uint64_t index) const {
  auto cached = Cached(node_stmt_, "SELECT hash FROM tree_nodes WHERE level = ? AND idx = ?");
  if (!cached.ok()) return cached.status();
  Statement& q = **cached;
  q.Bind(1, level).Bind(2, static_cast<int64_t>(index));
  auto row = q.Step();
  if (!row.ok()) return row.status();
  if (!*row || q.Blob(0).size() != Hash().size()) {
    q.Reset();
    return absl::DataLossError(
        absl::StrCat(label_, ": tree node level ", level, " index ", index, " missing"));
  }
  Hash h = ToHash(q.Blob(0));
  q.Reset();
  return h;
}

absl::StatusOr<std::vector<Hash>> EvidenceLog::InclusionProof(uint64_t seq,
                                                              uint64_t tree_size) const {
  return storage::InclusionProof(*this, seq, tree_size);
}

absl::StatusOr<std::vector<Hash>> EvidenceLog::ConsistencyProof(uint64_t old_size,
                                                                uint64_t new_size) const {
  return storage::ConsistencyProof(*this, old_size, new_size);
}

absl::StatusOr<Hash> EvidenceLog::RootAt(uint64_t size) const {
  return storage::RootAt(*this, size);
}

absl::Status EvidenceLog::ForEachEntry(const std::function<absl::Status(const LogEntry&)>& fn,
                                       uint64_t from_seq) const {
  auto q = Prepare(
      absl::StrCat("SELECT ", kEntryColumns, " FROM entries WHERE seq >= ? ORDER BY seq"));
  if (!q.ok()) return q.status();
  q->Bind(1, static_cast<int64_t>(from_seq));
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(ReadEntry(*q)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachSubject(
    const std::function<absl::Status(uint64_t, const std::string&, const std::string&)>& fn,
    uint64_t from_seq) const {
  auto q = Prepare("SELECT seq, name, sha256 FROM subjects WHERE seq >= ? ORDER BY seq, rowid");
  if (!q.ok()) return q.status();
  q->Bind(1, static_cast<int64_t>(from_seq));
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(static_cast<uint64_t>(q->Int(0)), q->Text(1), q->Text(2)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachCheckpoint(
    const std::function<absl::Status(uint64_t, const std::string&)>& fn,
    uint64_t from_size) const {
  auto q = Prepare("SELECT size, note FROM checkpoints WHERE size >= ? ORDER BY size");
  if (!q.ok()) return q.status();
  q->Bind(1, static_cast<int64_t>(from_size));
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(static_cast<uint64_t>(q->Int(0)), q->Text(1)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachNode(
    const std::function<absl::Status(int, uint64_t, const Hash&)>& fn,
    uint64_t from_seq) const {
  // A node at (level, idx) covers leaves up to ((idx + 1) << level) - 1.
  auto q = Prepare(
      "SELECT level, idx, hash FROM tree_nodes WHERE ((idx + 1) << level) > ?"
      " ORDER BY level, idx");
  if (!q.ok()) return q.status();
  q->Bind(1, static_cast<int64_t>(from_seq));
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(static_cast<int>(q->Int(0)), static_cast<uint64_t>(q->Int(1)),
                    ToHash(q->Blob(2)));
        !s.ok()) {
      return s;
    }
  }
  return row.status();
}

absl::StatusOr<std::string> EvidenceLog::IntegrityCheck(bool quick) const {
  auto q = Prepare(quick ? "PRAGMA quick_check" : "PRAGMA integrity_check");
  if (!q.ok()) return q.status();
  std::string out;
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (!out.empty()) out += "; ";
    out += q->Text(0);
  }
  if (!row.ok()) return row.status();
  return out;
}

absl::StatusOr<std::vector<std::string>> EvidenceLog::TriggerNames() const {
  auto q = Prepare("SELECT name FROM sqlite_schema WHERE type = 'trigger' ORDER BY name");
  if (!q.ok()) return q.status();
  std::vector<std::string> names;
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) names.push_back(q->Text(0));
  if (!row.ok()) return row.status();
  return names;
}

}  // namespace ckpt::storage
