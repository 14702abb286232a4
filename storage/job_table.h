// The daemon's durable jobs: rows of the `jobs` table (schema version 2, docs/daemon.md
// "Durability") on a connection of their own.
//
// Ids are "job-<n>-<tag>": n counts every job the log ever held and tag is 8 random hex digits
// chosen when the table is opened, so an id never repeats across restarts, not even after the
// database is restored from a backup. A job's id and request never change and no row is deleted
// (triggers refuse both); its state and outcome are updated as it runs. Nothing signed is read
// from here: the outcome's record id points into the log, where the signed record is.
//
// Whoever can write the database file can also insert rows or drop the triggers. So the writer
// authenticates each row it inserts (schema version 4): an HMAC-SHA-256 over the job's id,
// request and creation time, under a key that is not in the database (JobRowKeyOf). A row read
// back through a writer's table says whether its code verifies; the daemon runs no job whose
// row does not (docs/daemon.md, "Who can do what").
// Not thread-safe: callers serialize.
#ifndef CKPT_STORAGE_JOB_TABLE_H_
#define CKPT_STORAGE_JOB_TABLE_H_

#include <sqlite3.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"

namespace ckpt::storage {

struct JobRow {
  std::string id;
  std::string root;
  std::string source_root;
  std::string policy;
  std::string root_map;      // "DECLARED=ACTUAL" lines
  std::string invoker;  // who submitted it, as the service names callers
  std::string forward_layers;  // schema 3: the block forward's layers ("" none)
  std::string device;          // schema 3: its device ("", "cpu", "cuda")
  std::string emulate;         // schema 3: its backend emulation ("" none)
  std::string state;         // queued|running|succeeded|failed|cancelled|interrupted
  std::string verdict;
  int64_t record_id = -1;
  int error_code = 0;  // absl::StatusCode
  std::string error_message;
  std::string created_at;
  std::string finished_at;
  int64_t interruptions = 0;  // schema 4: runs a daemon stop or crash ended
  std::string mac;            // schema 4: hex HMAC-SHA-256 of the request, set by Insert
  int64_t parts = 0;          // schema 5: Slurm parts requested (0: run by the daemon itself)
  std::string executor_job;   // schema 5: the Slurm array job running it, once submitted
  // Schema 6: the OCI referrers ckpt-auditd --attach pushed for its record, one line each:
  // "DIGEST PREDICATE_TYPE api|tag" (listed by the referrers API or a tag index).
  std::string referrers;
  bool authentic = false;     // read through a writer's table: `mac` verifies under its key
};

// The key of the job rows' authentication codes.
using JobRowKey = std::array<uint8_t, 32>;

// The daemon's job row key, derived from its signing key (whose file the daemon requires to be
// readable by its owner only): SHA-256 of the Ed25519 signature, deterministic, of a fixed label
// that nothing else the key signs can equal (DSSE signs "DSSEv1 ...", checkpoints sign lines of
// a note). Outside the database, so a database writer cannot compute a valid code. Errors only
// from a token key.
absl::StatusOr<JobRowKey> JobRowKeyOf(const evidence::SigningKey& key);

class JobTable {
 public:
  // Opens the jobs table of the log at `path` (schema version 2 or later; the EvidenceLog writer
  // migrates; an older table answers with empty columns for what it lacks). `label` names the
  // database in errors. With `writer_key` the table is opened read-write, Insert authenticates
  // its rows under that key and every row read says whether it is authentic; without, it is
  // read-only and answers Get and Unfinished only (no row then counts as authentic).
  static absl::StatusOr<std::unique_ptr<JobTable>> Open(const std::string& path,
                                                        const std::string& label,
                                                        std::optional<JobRowKey> writer_key);
  ~JobTable();
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  // Inserts a queued job; fills in its id. `row.created_at` must be set.
  absl::Status Insert(JobRow& row);
  // Writes the state, outcome (referrers included), interruption and executor_job columns of
  // the job `row.id`.
  absl::Status Update(const JobRow& row);
  absl::StatusOr<JobRow> Get(const std::string& id) const;
  // Queued and running jobs, oldest first.
  absl::StatusOr<std::vector<JobRow>> Unfinished() const;

 private:
  JobTable(sqlite3* db, std::string label, std::string tag, std::optional<JobRowKey> key)
      : db_(db), label_(std::move(label)), tag_(std::move(tag)), key_(key) {}
  std::string Columns() const;  // the SELECT list for this table's schema version
  std::string Mac(const JobRow& row) const;  // requires key_
  void Authenticate(JobRow& row) const;      // sets row.authentic
  sqlite3* const db_;
  int64_t version_ = 2;
  const std::string label_;
  const std::string tag_;
  const std::optional<JobRowKey> key_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_JOB_TABLE_H_
