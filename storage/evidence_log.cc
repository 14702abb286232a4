#include "storage/evidence_log.h"

#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
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

// Rolls back an open transaction unless committed.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void Committed() { done_ = true; }

 private:
  sqlite3* db_;
  bool done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EvidenceLog>> EvidenceLog::Open(const std::string& path,
                                                               bool create,
                                                               const std::string& origin) {
  struct stat st;
  if (!create && ::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no evidence database"));
  }
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (create ? SQLITE_OPEN_CREATE : 0);
  int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteStatus(db, rc, path);
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<EvidenceLog> log(new EvidenceLog(path, db));
  if (auto s = log->Configure(create, origin); !s.ok()) return s;
  return log;
}

EvidenceLog::~EvidenceLog() {
  node_stmt_.reset();
  entry_stmt_.reset();
  subject_stmt_.reset();
  insert_node_stmt_.reset();
  sqlite3_close(db_);
}

absl::StatusOr<Statement> EvidenceLog::Prepare(const std::string& sql) const {
  return Statement::Prepare(db_, sql, path_);
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

absl::Status EvidenceLog::Configure(bool create, const std::string& origin) {
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, 10000);
  // journal_mode answers with a row, so it goes through Exec (which ignores rows).
  if (auto s = Exec(db_,
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"
                    " PRAGMA recursive_triggers=ON; PRAGMA wal_autocheckpoint=8192;",
                    path_);
      !s.ok()) {
    return s;
  }
  if (auto s = Migrate(); !s.ok()) return s;
  auto get = Prepare("SELECT value FROM meta WHERE key = 'origin'");
  if (!get.ok()) return get.status();
  auto row = get->Step();
  if (!row.ok()) return row.status();
  if (*row) {
    origin_ = get->Text(0);
    return absl::OkStatus();
  }
  if (!create) return absl::DataLossError(absl::StrCat(path_, ": log has no origin"));
  // A fresh database: fix its origin once; the meta triggers keep it.
  auto put = Prepare("INSERT OR IGNORE INTO meta(key, value) VALUES('origin', ?)");
  if (!put.ok()) return put.status();
  put->Bind(1, origin.empty() ? RandomOrigin() : origin);
  if (auto s = put->Run(); !s.ok()) return s;
  return Configure(false, "");
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
  if (auto s = Exec(db_, "BEGIN IMMEDIATE", path_); !s.ok()) return s;
  Transaction tx(db_);
  auto locked = SchemaVersion();  // another process may have migrated meanwhile
  if (!locked.ok()) return locked.status();
  int64_t version = *locked;
  if (version > kLogSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": schema version ", version, " is newer than this tool's ", kLogSchemaVersion));
  }
  // Each step takes the schema from version N to N+1; older logs run every step after theirs.
  if (version < 1) {
    if (auto s = Exec(db_, absl::StrCat(kSchemaV1, TriggerSql(), "PRAGMA user_version = 1;"),
                      path_);
        !s.ok()) {
      return s;
    }
  }
  if (auto s = Exec(db_, "COMMIT", path_); !s.ok()) return s;
  tx.Committed();
  return absl::OkStatus();
}

absl::StatusOr<AppendResult> EvidenceLog::Append(const std::string& envelope,
                                                 const evidence::SigningKey& log_key) {
  return AppendBatch({envelope}, log_key);
}

absl::StatusOr<AppendResult> EvidenceLog::AppendBatch(const std::vector<std::string>& envelopes,
                                                      const evidence::SigningKey& log_key) {
  if (envelopes.empty()) return absl::InvalidArgumentError("nothing to append");
  // IMMEDIATE takes the write lock now, so two appenders never both read the same size.
  if (auto s = Exec(db_, "BEGIN IMMEDIATE", path_); !s.ok()) return s;
  Transaction tx(db_);
  auto result = AppendLocked(envelopes, log_key);
  if (!result.ok()) return result.status();
  if (auto s = Exec(db_, "COMMIT", path_); !s.ok()) return s;
  tx.Committed();
  return result;
}

absl::StatusOr<AppendResult> EvidenceLog::AppendLocked(const std::vector<std::string>& envelopes,
                                                       const evidence::SigningKey& log_key) {
  auto size = Size();
  if (!size.ok()) return size.status();
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
  r.checkpoint = SignCheckpoint({origin_, seq, r.root}, log_key);
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
  if (!*row) return absl::NotFoundError(absl::StrCat(path_, ": record is not in this log"));
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
  auto q = Prepare(absl::StrCat("SELECT ", kEntryColumns, " FROM entries WHERE seq = ?"));
  if (!q.ok()) return q.status();
  q->Bind(1, static_cast<int64_t>(seq));
  auto row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(path_, ": no record ", seq));
  return ReadEntry(*q);
}

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
  add(f.since, "audit_time >= ?");
  add(f.until, "audit_time < ?");
  int64_t before = -1;
  if (!f.page_token.empty()) {
    if (!absl::SimpleAtoi(f.page_token, &before) || before < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad page token '", f.page_token, "'"));
    }
    absl::StrAppend(&sql, " AND seq < ?");
  }
  absl::StrAppend(&sql, " ORDER BY seq DESC LIMIT ?");
  auto q = Prepare(sql);
  if (!q.ok()) return q.status();
  int i = 1;
  for (const std::string& t : texts) q->Bind(i++, t);
  if (before >= 0) q->Bind(i++, before);
  q->Bind(i, f.limit + 1);  // one more row tells whether another page exists
  QueryPage page;
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (page.entries.size() == static_cast<size_t>(f.limit)) {
      page.next_page_token = absl::StrCat(page.entries.back().seq);
      break;
    }
    page.entries.push_back(ReadEntry(*q));
  }
  if (!row.ok()) return row.status();
  return page;
}

absl::StatusOr<std::pair<uint64_t, std::string>> EvidenceLog::LatestCheckpoint() const {
  auto q = Prepare("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1");
  if (!q.ok()) return q.status();
  auto row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(path_, ": log is empty"));
  return std::make_pair(static_cast<uint64_t>(q->Int(0)), q->Text(1));
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
        absl::StrCat(path_, ": tree node level ", level, " index ", index, " missing"));
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

absl::Status EvidenceLog::ForEachEntry(
    const std::function<absl::Status(const LogEntry&)>& fn) const {
  auto q = Prepare(absl::StrCat("SELECT ", kEntryColumns, " FROM entries ORDER BY seq"));
  if (!q.ok()) return q.status();
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(ReadEntry(*q)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachSubject(
    const std::function<absl::Status(uint64_t, const std::string&, const std::string&)>& fn)
    const {
  auto q = Prepare("SELECT seq, name, sha256 FROM subjects ORDER BY seq, rowid");
  if (!q.ok()) return q.status();
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(static_cast<uint64_t>(q->Int(0)), q->Text(1), q->Text(2)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachCheckpoint(
    const std::function<absl::Status(uint64_t, const std::string&)>& fn) const {
  auto q = Prepare("SELECT size, note FROM checkpoints ORDER BY size");
  if (!q.ok()) return q.status();
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    if (auto s = fn(static_cast<uint64_t>(q->Int(0)), q->Text(1)); !s.ok()) return s;
  }
  return row.status();
}

absl::Status EvidenceLog::ForEachNode(
    const std::function<absl::Status(int, uint64_t, const Hash&)>& fn) const {
  auto q = Prepare("SELECT level, idx, hash FROM tree_nodes ORDER BY level, idx");
  if (!q.ok()) return q.status();
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

absl::StatusOr<std::string> EvidenceLog::IntegrityCheck() const {
  auto q = Prepare("PRAGMA integrity_check");
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
