#include "storage/job_table.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/sha256.h"
#include "storage/sqlite.h"

namespace ckpt::storage {
namespace {

constexpr char kColumns[] =
    "id, root, source_root, policy, root_map, invoker, state, verdict, record_id,"
    " error_code, error_message, created_at, finished_at";
// Schema 3's columns; a version-2 table reads them as empty.
constexpr char kForwardColumns[] = ", forward_layers, device, emulate";
constexpr char kNoForwardColumns[] = ", '', '', ''";
// Schema 4's; an older table reads them as never interrupted and unauthenticated.
constexpr char kMacColumns[] = ", interruptions, mac";
constexpr char kNoMacColumns[] = ", 0, ''";
// Schema 5's; an older table reads them as jobs the daemon runs itself.
constexpr char kExecutorColumns[] = ", parts, executor_job";
constexpr char kNoExecutorColumns[] = ", 0, ''";
// Schema 6's; an older table reads them as no referrers pushed.
constexpr char kReferrerColumns[] = ", referrers";
constexpr char kNoReferrerColumns[] = ", ''";
// What the daemon's key signs to make the job row key: one line without a newline, so neither
// a DSSE PAE ("DSSEv1 ...") nor a checkpoint note (lines each ending in a newline).
constexpr char kJobRowKeyLabel[] = "ckpt-auditd job row authentication key, version 1";

JobRow ReadRow(const Statement& q) {
  JobRow r;
  r.id = q.Text(0);
  r.root = q.Text(1);
  r.source_root = q.Text(2);
  r.policy = q.Text(3);
  r.root_map = q.Text(4);
  r.invoker = q.Text(5);
  r.state = q.Text(6);
  r.verdict = q.Text(7);
  r.record_id = q.Int(8);
  r.error_code = static_cast<int>(q.Int(9));
  r.error_message = q.Text(10);
  r.created_at = q.Text(11);
  r.finished_at = q.Text(12);
  r.forward_layers = q.Text(13);
  r.device = q.Text(14);
  r.emulate = q.Text(15);
  r.interruptions = q.Int(16);
  r.mac = q.Text(17);
  r.parts = q.Int(18);
  r.executor_job = q.Text(19);
  r.referrers = q.Text(20);
  return r;
}

// The authenticated fields, each as an 8-byte big-endian length and its bytes, so that no two
// different rows encode alike.
std::string MacMessage(const JobRow& r) {
  std::string out;
  for (const std::string* f : {&r.id, &r.root, &r.source_root, &r.policy, &r.root_map,
                               &r.invoker, &r.forward_layers, &r.device, &r.emulate,
                               &r.created_at}) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      out.push_back(static_cast<char>((static_cast<uint64_t>(f->size()) >> shift) & 0xff));
    }
    out += *f;
  }
  // Schema 5: only a split job adds its part count, so the codes of earlier rows still verify.
  if (r.parts != 0) absl::StrAppend(&out, "parts=", r.parts);
  return out;
}

}  // namespace

absl::StatusOr<JobRowKey> JobRowKeyOf(const evidence::SigningKey& key) {
  const std::string label = kJobRowKeyLabel;
  absl::StatusOr<evidence::Signature> sig = key.Sign(evidence::AsBytes(label));
  if (!sig.ok()) return sig.status();
  return Sha256Of(*sig);
}

absl::StatusOr<std::unique_ptr<JobTable>> JobTable::Open(const std::string& path,
                                                         const std::string& label,
                                                         std::optional<JobRowKey> writer_key) {
  const bool read_only = !writer_key.has_value();
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db,
      (read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqliteStatus(db, rc, label);
    sqlite3_close(db);
    return s;
  }
  sqlite3_extended_result_codes(db, 1);
  sqlite3_busy_timeout(db, 10000);
  uint8_t tag[4];
  RAND_bytes(tag, sizeof(tag));
  std::unique_ptr<JobTable> table(new JobTable(db, label, ToHex(tag), writer_key));
  if (!read_only) {
    if (auto s = Exec(db, "PRAGMA synchronous=FULL", label); !s.ok()) return s;
  }
  auto v = Statement::Prepare(db, "PRAGMA user_version", label);
  if (!v.ok()) return v.status();
  auto row = v->Step();
  if (!row.ok()) return row.status();
  if (v->Int(0) < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": schema version ", v->Int(0), " has no jobs table"));
  }
  table->version_ = v->Int(0);
  return table;
}

JobTable::~JobTable() { sqlite3_close(db_); }

std::string JobTable::Columns() const {
  return absl::StrCat(kColumns, version_ >= 3 ? kForwardColumns : kNoForwardColumns,
                      version_ >= 4 ? kMacColumns : kNoMacColumns,
                      version_ >= 5 ? kExecutorColumns : kNoExecutorColumns,
                      version_ >= 6 ? kReferrerColumns : kNoReferrerColumns);
}

std::string JobTable::Mac(const JobRow& row) const {
  const std::string message = MacMessage(row);
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key_->data(), static_cast<int>(key_->size()),
       reinterpret_cast<const uint8_t*>(message.data()), message.size(), mac, &size);
  return ToHex(std::span<const uint8_t>(mac, size));
}

void JobTable::Authenticate(JobRow& row) const {
  if (!key_) {
    row.authentic = false;
    return;
  }
  const std::string expected = Mac(row);
  row.authentic = row.mac.size() == expected.size() &&
                  CRYPTO_memcmp(row.mac.data(), expected.data(), expected.size()) == 0;
}

absl::Status JobTable::Insert(JobRow& row) {
  if (!key_) return absl::FailedPreconditionError(absl::StrCat(label_, ": jobs opened read-only"));
  if (version_ < 6) {
    return absl::FailedPreconditionError(
        absl::StrCat(label_, ": schema version ", version_, " is too old to record jobs"));
  }
  if (auto s = Exec(db_, "BEGIN IMMEDIATE", label_); !s.ok()) return s;
  RollbackGuard tx(db_);
  auto next = Statement::Prepare(db_, "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs", label_);
  if (!next.ok()) return next.status();
  auto has = next->Step();
  if (!has.ok()) return has.status();
  int64_t seq = next->Int(0);
  row.id = absl::StrFormat("job-%06d-%s", seq, tag_);
  row.state = "queued";
  row.interruptions = 0;
  row.mac = Mac(row);
  row.authentic = true;
  auto ins = Statement::Prepare(
      db_, absl::StrCat("INSERT INTO jobs(seq, ", kColumns, kForwardColumns, kMacColumns,
                        kExecutorColumns, kReferrerColumns,
                        ") VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"),
      label_);
  if (!ins.ok()) return ins.status();
  ins->Bind(1, seq)
      .Bind(2, row.id)
      .Bind(3, row.root)
      .Bind(4, row.source_root)
      .Bind(5, row.policy)
      .Bind(6, row.root_map)
      .Bind(7, row.invoker)
      .Bind(8, row.state)
      .Bind(9, row.verdict)
      .Bind(10, row.record_id)
      .Bind(11, static_cast<int64_t>(row.error_code))
      .Bind(12, row.error_message)
      .Bind(13, row.created_at)
      .Bind(14, row.finished_at)
      .Bind(15, row.forward_layers)
      .Bind(16, row.device)
      .Bind(17, row.emulate)
      .Bind(18, row.interruptions)
      .Bind(19, row.mac)
      .Bind(20, row.parts)
      .Bind(21, row.executor_job)
      .Bind(22, row.referrers);
  if (auto s = ins->Run(); !s.ok()) return s;
  if (auto s = Exec(db_, "COMMIT", label_); !s.ok()) return s;
  tx.Committed();
  return absl::OkStatus();
}

absl::Status JobTable::Update(const JobRow& row) {
  auto up = Statement::Prepare(
      db_,
      "UPDATE jobs SET state = ?, verdict = ?, record_id = ?, error_code = ?, error_message = ?,"
      " finished_at = ?, interruptions = ?, executor_job = ?, referrers = ? WHERE id = ?",
      label_);
  if (!up.ok()) return up.status();
  up->Bind(1, row.state)
      .Bind(2, row.verdict)
      .Bind(3, row.record_id)
      .Bind(4, static_cast<int64_t>(row.error_code))
      .Bind(5, row.error_message)
      .Bind(6, row.finished_at)
      .Bind(7, row.interruptions)
      .Bind(8, row.executor_job)
      .Bind(9, row.referrers)
      .Bind(10, row.id);
  if (auto s = up->Run(); !s.ok()) return s;
  if (sqlite3_changes(db_) != 1) {
    return absl::NotFoundError(absl::StrCat("no job ", row.id));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRow> JobTable::Get(const std::string& id) const {
  auto q = Statement::Prepare(db_, absl::StrCat("SELECT ", Columns(), " FROM jobs WHERE id = ?"),
                              label_);
  if (!q.ok()) return q.status();
  q->Bind(1, id);
  auto row = q->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no job ", id));
  JobRow r = ReadRow(*q);
  Authenticate(r);
  return r;
}

absl::StatusOr<std::vector<JobRow>> JobTable::Unfinished() const {
  auto q = Statement::Prepare(
      db_,
      absl::StrCat("SELECT ", Columns(),
                   " FROM jobs WHERE state IN ('queued', 'running') ORDER BY seq"),
      label_);
  if (!q.ok()) return q.status();
  std::vector<JobRow> rows;
  absl::StatusOr<bool> row;
  while ((row = q->Step()).ok() && *row) {
    rows.push_back(ReadRow(*q));
    Authenticate(rows.back());
  }
  if (!row.ok()) return row.status();
  return rows;
}

}  // namespace ckpt::storage
