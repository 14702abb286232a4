// The daemon's durable jobs: rows of the `jobs` table (schema version 2, docs/daemon.md
// "Durability") on a connection of their own.
//
// Ids are "job-<n>-<tag>": n counts every job the log ever held and tag is 8 random hex digits
// chosen when the table is opened, so an id never repeats across restarts, not even after the
// database is restored from a backup. A job's id and request never change and no row is deleted
// (triggers refuse both); its state and outcome are updated as it runs. Nothing signed is read
// from here: the outcome's record id points into the log, where the signed record is.
// Not thread-safe: callers serialize.
#ifndef CKPT_STORAGE_JOB_TABLE_H_
#define CKPT_STORAGE_JOB_TABLE_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

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
};

class JobTable {
 public:
  // Opens the jobs table of the log at `path` (schema version 2 or later; the EvidenceLog writer
  // migrates; a version-2 table, read only, answers with empty schema-3 columns). `label` names the database in errors. A read-only table answers Get and
  // Unfinished only.
  static absl::StatusOr<std::unique_ptr<JobTable>> Open(const std::string& path,
                                                        const std::string& label, bool read_only);
  ~JobTable();
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  // Inserts a queued job; fills in its id. `row.created_at` must be set.
  absl::Status Insert(JobRow& row);
  // Writes the state and outcome columns of the job `row.id`.
  absl::Status Update(const JobRow& row);
  absl::StatusOr<JobRow> Get(const std::string& id) const;
  // Queued and running jobs, oldest first.
  absl::StatusOr<std::vector<JobRow>> Unfinished() const;

 private:
  JobTable(sqlite3* db, std::string label, std::string tag)
      : db_(db), label_(std::move(label)), tag_(std::move(tag)) {}
  std::string Columns() const;  // the SELECT list for this table's schema version
  sqlite3* const db_;
  int64_t version_ = 2;
  const std::string label_;
  const std::string tag_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_JOB_TABLE_H_
