// The append-only evidence log: signed DSSE records in SQLite under an RFC 6962 Merkle tree.
//
// Each entry is the exact bytes of one DSSE envelope; its leaf hash is SHA-256(0x00 || bytes).
// Every append runs in one `BEGIN IMMEDIATE` transaction that inserts the entry, its subject
// digests, the complete-subtree hashes it finishes (so proofs need O(log n) lookups) and a
// signed C2SP checkpoint of the new tree head. Triggers abort any UPDATE or DELETE (with
// recursive_triggers on, so INSERT OR REPLACE cannot bypass them); the WAL journal with
// synchronous=FULL makes a reported append survive a crash or power loss. Schema and migrations:
// docs/evidence.md. One EvidenceLog per thread.
//
// One writer per log: a writer holds an exclusive flock on the sidecar file `<db>.lock` for its
// whole life, so a second daemon or CLI writer is refused (FAILED_PRECONDITION) instead of
// interleaving with it. A writer runs PRAGMA quick_check at open; a log that fails it, a database
// file without write permission, or a read-only filesystem gives a log that serves reads and
// verification but refuses appends (see append_status()). Readers (OpenReadOnly) take no lock and
// never block the writer (WAL). New database files are created 0600.
//
// A writer appends only to the log it opened: an append finding more or fewer entries than the
// writer saw at open and appended since (someone else wrote or deleted rows) is refused, so a
// record id is never handed out twice. With KeepHeadIn it also keeps the newest signed checkpoint
// in a file of its own (storage/head_state.h, docs/evidence.md "Rollback and fork detection").
#ifndef CKPT_STORAGE_EVIDENCE_LOG_H_
#define CKPT_STORAGE_EVIDENCE_LOG_H_

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/evidence/ed25519.h"
#include "storage/merkle.h"
#include "storage/sqlite.h"

namespace ckpt::storage {

inline constexpr int kLogSchemaVersion = 6;

struct LogEntry {
  uint64_t seq = 0;          // leaf index, from 0; the record id users see
  std::string envelope;      // exact DSSE bytes
  Hash leaf_hash{};          // as stored
  std::string predicate_type;
  std::string keyid;         // first signature's key id
  std::string root;          // audited root path
  std::string policy;
  std::string verdict;
  std::string time;          // the record's finish time (RFC 3339)
};

struct AppendResult {
  uint64_t seq = 0;
  uint64_t tree_size = 0;
  Hash root{};
  std::string checkpoint;  // signed note
};

struct QueryFilter {
  std::string digest;  // a subject's sha256 (hex)
  std::string root;
  std::string verdict;
  std::string policy;
  std::string predicate_type;      // exact predicateType URI
  std::optional<absl::Time> since;  // inclusive; entries without a time never match a time filter
  std::optional<absl::Time> until;  // exclusive
  int limit = 50;
  std::string page_token;  // from a previous QueryPage; newest first
};

struct QueryPage {
  std::vector<LogEntry> entries;
  std::string next_page_token;  // empty when there is no further page
};

struct LogOpenOptions {
  bool create = false;  // create (0600) and migrate a missing log
  std::string origin;   // a new log's origin; default "ckpt-audit.local/" + 16 random hex digits
  // How the log is named in error messages; default its path. A server passes a name that does
  // not reveal its filesystem layout.
  std::string label;
};

class EvidenceLog final : public NodeReader {
 public:
  // Opens the log at `path` as its writer (see the file comment). Errors: NOT_FOUND (missing and
  // !create), DATA_LOSS (not a database or unreadable), FAILED_PRECONDITION (newer schema, or
  // another writer holds the lock).
  static absl::StatusOr<std::unique_ptr<EvidenceLog>> Open(const std::string& path,
                                                           const LogOpenOptions& options);
  static absl::StatusOr<std::unique_ptr<EvidenceLog>> Open(const std::string& path, bool create,
                                                           const std::string& origin = "") {
    return Open(path, LogOpenOptions{create, origin, ""});
  }
  // A read-only connection: no lock, no migration, appends refused. On a read-only filesystem
  // where SQLite cannot create the WAL index (and no WAL file exists) the file is opened
  // immutable. Older schemas are readable.
  static absl::StatusOr<std::unique_ptr<EvidenceLog>> OpenReadOnly(const std::string& path,
                                                                   const std::string& label = "");
  ~EvidenceLog() override;

  const std::string& path() const { return path_; }
  const std::string& label() const { return label_; }
  const std::string& origin() const { return origin_; }
  // OK when Append may be called; otherwise why it is refused (read-only file or filesystem,
  // quick_check failure, reader connection).
  const absl::Status& append_status() const { return append_status_; }
  int64_t schema_version() const { return schema_version_; }

  // Runs `fn` inside one read transaction, so every query it makes sees the same snapshot.
  absl::Status InReadTransaction(const std::function<absl::Status()>& fn) const;

  // From now on keeps the newest signed checkpoint in the file `path` (storage/head_state.h):
  // FAILED_PRECONDITION, naming both heads, unless the stored tree extends the head remembered
  // there (a missing file remembers nothing); then every append writes its checkpoint there,
  // durably, before it returns. When that write fails the append is still reported (it is
  // committed) and the next append first retries the write, refusing to append until it succeeds.
  absl::Status KeepHeadIn(const std::string& path);

  // Appends one envelope (its payload must be an evidence or verification-summary Statement)
  // and signs the new tree head with `log_key`, which must be the key that signed the latest
  // checkpoint: FAILED_PRECONDITION naming both keys otherwise, and nothing is appended. A key
  // rotation names the old key as `previous_key`: the latest checkpoint must be its, and the
  // new one is signed by both, so either key's trust file verifies the handover
  // (docs/evidence.md, "One key per log").
  absl::StatusOr<AppendResult> Append(const std::string& envelope,
                                      const evidence::SigningKey& log_key,
                                      const evidence::SigningKey* previous_key = nullptr);
  // Appends many envelopes in one transaction with one checkpoint at the end (bulk import).
  absl::StatusOr<AppendResult> AppendBatch(const std::vector<std::string>& envelopes,
                                           const evidence::SigningKey& log_key,
                                           const evidence::SigningKey* previous_key = nullptr);

  absl::StatusOr<uint64_t> Size() const;
  absl::StatusOr<LogEntry> Get(uint64_t seq) const;
  // The seq of the first entry with this leaf hash; NOT_FOUND if none.
  absl::StatusOr<uint64_t> FindByLeafHash(const Hash& leaf) const;
  absl::StatusOr<QueryPage> Query(const QueryFilter& filter) const;
  // The newest signed checkpoint (size, note); NOT_FOUND for an empty log.
  absl::StatusOr<std::pair<uint64_t, std::string>> LatestCheckpoint() const;

  absl::StatusOr<Hash> Node(int level, uint64_t index) const override;
  absl::StatusOr<std::vector<Hash>> InclusionProof(uint64_t seq, uint64_t tree_size) const;
  absl::StatusOr<std::vector<Hash>> ConsistencyProof(uint64_t old_size, uint64_t new_size) const;
  absl::StatusOr<Hash> RootAt(uint64_t size) const;

  // Raw walks for the verifier, in seq / size / (level, idx) order, from entry `from_seq` on
  // (checkpoints: sizes >= from_seq; nodes: those covering a leaf >= from_seq).
  absl::Status ForEachEntry(const std::function<absl::Status(const LogEntry&)>& fn,
                            uint64_t from_seq = 0) const;
  absl::Status ForEachSubject(
      const std::function<absl::Status(uint64_t seq, const std::string& name,
                                       const std::string& sha256)>& fn,
      uint64_t from_seq = 0) const;
  absl::Status ForEachCheckpoint(
      const std::function<absl::Status(uint64_t size, const std::string& note)>& fn,
      uint64_t from_size = 0) const;
  absl::Status ForEachNode(
      const std::function<absl::Status(int level, uint64_t idx, const Hash& h)>& fn,
      uint64_t from_seq = 0) const;
  // "ok" or SQLite's list of problems (`quick`: PRAGMA quick_check, O(file) but no index
  // cross-checks); names of the append-only triggers present.
  absl::StatusOr<std::string> IntegrityCheck(bool quick = false) const;
  absl::StatusOr<std::vector<std::string>> TriggerNames() const;

 private:
  EvidenceLog(std::string path, std::string label, sqlite3* db, int lock_fd)
      : path_(std::move(path)), label_(std::move(label)), db_(db), lock_fd_(lock_fd) {}
  static absl::StatusOr<std::unique_ptr<EvidenceLog>> OpenConnection(const std::string& path,
                                                                     const std::string& label,
                                                                     bool read_only,
                                                                     bool immutable,
                                                                     int lock_fd);
  absl::Status Configure(bool create, const std::string& origin);
  absl::Status ReadOrigin();
  absl::Status Migrate();
  absl::StatusOr<int64_t> SchemaVersion() const;
  // FAILED_PRECONDITION naming the key that signed the latest entry and `log_key`.
  absl::Status OtherKey(uint64_t size, const evidence::SigningKey& log_key) const;
  // Whether the latest checkpoint of a log of `size` entries is signed by `key`.
  absl::StatusOr<bool> SignsLatest(uint64_t size, const evidence::SigningKey& key) const;
  absl::StatusOr<AppendResult> AppendLocked(const std::vector<std::string>& envelopes,
                                            const evidence::SigningKey& log_key,
                                            const evidence::SigningKey* previous_key);
  absl::Status InsertOne(uint64_t seq, const std::string& envelope);
  absl::StatusOr<Statement> Prepare(const std::string& sql) const;
  // A statement prepared once per connection and reused (appends, proofs and the daemon's reads
  // are hot paths). The caller resets it before returning (ResetOnExit): a statement left
  // stepping would hold its read snapshot open.
  absl::StatusOr<Statement*> Cached(std::optional<Statement>& slot, const char* sql) const;
  // The same for Query's statements, one per combination of filters (a bounded set).
  absl::StatusOr<Statement*> CachedQuery(const std::string& sql) const;

  const std::string path_;
  const std::string label_;
  sqlite3* const db_;
  const int lock_fd_;  // the writer lock (flock held), or -1 for a reader
  std::string origin_;
  uint64_t size_ = 0;        // entries the writer saw at open and appended since
  std::string head_path_;    // KeepHeadIn's file, or empty
  std::string unsaved_head_; // a checkpoint appended but not yet written to head_path_
  absl::Status append_status_;
  int64_t schema_version_ = 0;
  mutable std::optional<Statement> node_stmt_, entry_stmt_, subject_stmt_, insert_node_stmt_,
      get_stmt_, latest_checkpoint_stmt_;
  mutable std::map<std::string, Statement> query_stmts_;  // by SQL text
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_EVIDENCE_LOG_H_
