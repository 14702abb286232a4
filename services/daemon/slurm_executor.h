// The daemon's Slurm executor (docs/daemon.md "Slurm executor"): an audit job runs as a Slurm
// job array of `audit --part I/N` processes on the cluster's nodes, each signing its part with
// the node key; the daemon follows the array, checks and merges the parts with the core merge
// (core/audit/parts.h) and the backend signs the record as for a local audit.
//
// The parts of job ID live in PARTS_DIR/ID/ (a directory every node shares): the script the
// array runs, each part's output and part-I.json. The array job id is stored with the job
// (JobRun::SetExecutorJob), so a daemon that restarts follows the same array; the array is also
// named after the job, which finds it when the daemon stopped between submitting and storing.
// Parts are trusted only under the part trust file (node keys, never the record trust store),
// and only when they ran with the options the job asked for.
#ifndef CKPT_SERVICES_DAEMON_SLURM_EXECUTOR_H_
#define CKPT_SERVICES_DAEMON_SLURM_EXECUTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/record.h"
#include "core/evidence/trust_store.h"
#include "services/daemon/job_manager.h"

namespace ckpt::daemon {

struct SlurmOptions {
  std::string parts_dir;   // shared by the daemon and every node
  std::string node_key;    // the part-signing key, as the nodes see it
  std::string part_trust;  // trust file of the node keys (read here, at start)
  std::string audit_binary = "ckpt-audit";   // as the nodes see it
  std::vector<std::string> sbatch_args;      // added to every sbatch (partition, time, ...)
  unsigned max_parts = 64;
  uint64_t bytes_per_part = uint64_t{256} << 30;  // the default split: one part per this much
  absl::Duration poll = absl::Seconds(1);
  // How long slurmctld may not answer while an array runs before the job fails UNAVAILABLE.
  absl::Duration unreachable_grace = absl::Seconds(30);
  absl::Duration command_timeout = absl::Seconds(30);  // each sbatch, scontrol, sacct, scancel
};

class SlurmExecutor {
 public:
  // INVALID_ARGUMENT for a missing setting; the part trust file's errors.
  static absl::StatusOr<std::unique_ptr<SlurmExecutor>> Create(SlurmOptions options);

  // The parts of a job: `requested` when not 0 (INVALID_ARGUMENT above max_parts), else one per
  // bytes_per_part of both trees' files, at least 1 and at most max_parts.
  absl::StatusOr<unsigned> PartsFor(unsigned requested, const std::string& root,
                                    const std::string& source) const;

  // Submits the parts of `spec` (or follows the array already running them) and merges them
  // into the record. `options`: the audit the parts must have run (their options must equal
  // it). Per-part states go to `run` as "parts" events. CANCELLED when `run` is cancelled (the
  // array is scancelled when CancelJob asked; left running when the daemon stops); ABORTED
  // naming the part and its Slurm state when one ended otherwise than COMPLETED (the rest are
  // scancelled); UNAVAILABLE when slurmctld does not answer; the merge's refusals.
  absl::StatusOr<evidence::EvidenceRecord> Run(const JobSpec& spec,
                                               const audit::AuditOptions& options,
                                               JobRun& run) const;

 private:
  SlurmExecutor(SlurmOptions options, evidence::TrustStore trust)
      : options_(std::move(options)), trust_(std::move(trust)) {}
  class Array;
  const SlurmOptions options_;
  const evidence::TrustStore trust_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_SLURM_EXECUTOR_H_
