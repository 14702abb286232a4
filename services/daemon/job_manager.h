// Audit jobs for the daemon: durable rows in the evidence database (storage/job_table.h), a
// bounded queue, a fixed set of worker threads, and per-job event histories that any number of
// watchers can follow (late watchers replay from the start).
//
// Two lanes: jobs whose block forward runs on the GPU (JobSpec::device "cuda") wait in the GPU
// lane, served by one worker of its own, so one GPU job runs at a time on the device while the
// CPU workers keep taking the other audits.
//
// Durability (docs/daemon.md "Durability"): a job is written to the jobs table before Submit
// returns its id, and every state change is written as it happens. On start the manager recovers
// the table: queued jobs are queued again in submission order, and so are jobs that were running
// when the daemon stopped (crash, kill, or a stop that ended them), each at most
// kMaxInterruptions times: a job interrupted once more ends FAILED with the reason, since a job
// that stops the daemon would keep stopping it. A row whose authentication code does not verify
// (storage/job_table.h: the daemon did not write it) is never run: it ends FAILED saying so.
// Get answers for every id the table holds; event histories are kept in memory for the jobs of
// this run only (the newest `max_retained` finished ones).
//
// No gRPC in here: the AuditService adapter turns these events into stream messages, and tests
// drive the manager directly. Thread-safe; in-memory state is guarded by mu_, the table by
// table_mu_ and its read-only connection by lookup_mu_ (neither held together with mu_ while
// waiting).
#ifndef CKPT_SERVICES_DAEMON_JOB_MANAGER_H_
#define CKPT_SERVICES_DAEMON_JOB_MANAGER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/io/file_system.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "storage/job_table.h"

namespace ckpt::daemon {

// kInterrupted only for rows of daemons before 2026-12-01, which did not re-run such jobs.
enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled, kInterrupted };

struct JobSpec {
  std::string root;
  std::string source_root;
  std::string policy;
  std::vector<quant::RootMapping> root_map;
  std::string invoker;  // who asked (auth.h Caller::Invoker()); recorded in the record
  std::string forward_layers;  // "", "all" or "L1,L2,...": the block forward's layers
  std::string device;          // of the block forward: "" or "cpu", or "cuda" (GPU lane)
  std::string emulate;         // "" or a forward::Emulation name
  // Slurm executor (docs/daemon.md "Slurm executor"): the parts the audit splits into (0 on
  // the local executor), and the array job running them once submitted (kept across restarts,
  // so a recovered job follows its array instead of submitting another).
  unsigned parts = 0;
  std::string executor_job;
  // The directories opened and allow-list checked at submission; the job reads through them,
  // so a path swapped while the job waits cannot redirect it. In memory only (a descriptor
  // cannot outlive the process): a job recovered after a restart opens and checks its roots
  // again. Released when the job finishes.
  std::shared_ptr<const io::Directory> root_dir, source_dir;
};

// One OCI referrer ckpt-auditd --attach pushed for a job's record.
struct JobReferrer {
  std::string digest;          // the referrer manifest's
  std::string predicate_type;  // of the statement its bundle holds
  bool referrers_api = false;  // listed by the registry's referrers API (else by a tag index)
  bool operator==(const JobReferrer&) const = default;
};

// What a finished audit reports back.
struct JobOutcome {
  std::string verdict;  // "pass" / "fail"
  int64_t record_id = -1;
  uint64_t bytes_read = 0;  // bytes the audit read from storage (both trees of a pair)
  // ckpt-auditd --attach: why pushing the record as OCI referrers failed (OK when it was
  // pushed or not asked for). The job still succeeds: its record is in the log, and the job's
  // error says what went wrong (docs/daemon.md, "OCI subjects").
  absl::Status attach;
  std::vector<JobReferrer> referrers;  // --attach: what was pushed, when it all was
};

struct JobCounts {
  size_t queued = 0;
  size_t running = 0;
};

struct JobSnapshot {
  std::string id;
  JobSpec spec;
  JobState state = JobState::kQueued;
  JobOutcome outcome;
  // Set when failed, cancelled or interrupted; for a succeeded job, JobOutcome::attach.
  absl::Status error;
  std::string created_at, finished_at;
  int64_t interruptions = 0;  // runs that a daemon stop or crash ended
};

struct JobEvent {
  std::string phase;
  uint64_t done_units = 0;
  uint64_t total_units = 0;
  std::string message;
  bool done = false;  // the last event of the job
};

// What a job's work gets: progress (Cancelled() is true when the job is cancelled or the daemon
// stops), and the means to tell the two apart, to note a message for watchers and to record the
// executor's id of the job durably.
class JobRun : public Progress {
 public:
  virtual const std::string& id() const = 0;
  // CancelJob asked (not the daemon's stop, after which a recovered job runs again).
  virtual bool CancelledByCaller() const = 0;
  // An event for watchers, outside the engine's phases (per-part states of a Slurm job).
  virtual void Note(std::string_view phase, uint64_t done_units, uint64_t total_units,
                    std::string message) = 0;
  // Stores JobSpec::executor_job in the job's row before returning.
  virtual absl::Status SetExecutorJob(const std::string& executor_job) = 0;
  // Called just before the record is signed: false once the job was cancelled (nothing may be
  // signed then). After it returned true, CancelJob answers FAILED_PRECONDITION, so a cancel
  // that was accepted always means that nothing was signed.
  virtual bool Commit() = 0;
};

class JobManager {
 public:
  // How often a restart may interrupt a job that then runs again.
  static constexpr int kMaxInterruptions = 3;
  // `run.Cancelled()` turns true when the job is cancelled or the daemon stops; the work should
  // then return absl::CancelledError without signing anything.
  using Work = std::function<absl::StatusOr<JobOutcome>(const JobSpec&, JobRun&)>;

  // Jobs persist in `table`; `lookup`, a read-only connection to the same table, answers Get
  // for the jobs no longer in memory, so that a lookup never waits for a write on `table` (a
  // write may wait for SQLite's lock). Both must outlive the manager. `workers` audits run at
  // once; at most `max_queued` wait (RESOURCE_EXHAUSTED beyond). With a non-OK `accepting` (a
  // read-only log) no job is recovered or accepted: Submit returns that status, and `table`
  // (which may then be null, as `lookup` may: a log too old to have one) is not used.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(Work work, storage::JobTable* table,
                                                            storage::JobTable* lookup,
                                                            absl::Status accepting,
                                                            unsigned workers, size_t max_queued,
                                                            size_t max_retained = 1024);
  // Stops taking jobs, asks running ones to stop and waits for them. Queued jobs stay queued in
  // the table and run when the daemon starts again, as do the running ones that stopped (each
  // counts as an interruption).
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  absl::StatusOr<std::string> Submit(JobSpec spec);
  absl::StatusOr<JobSnapshot> Get(const std::string& id) const;
  JobCounts Counts() const;
  // One line per job that recovery at start did not simply queue again (queued again after an
  // interruption, failed after too many, refused as not written by the daemon), for the log.
  const std::vector<std::string>& recovery_notes() const { return recovery_notes_; }

  // A queued job is cancelled at once; a running one is asked to stop (its work polls
  // Progress::Cancelled) and ends kCancelled, signing nothing. FAILED_PRECONDITION for a
  // finished job and for one signing its record (JobRun::Commit), NOT_FOUND for an unknown id.
  absl::StatusOr<JobSnapshot> Cancel(const std::string& id);

  // For a graceful stop: refuses new jobs (UNAVAILABLE), starts no queued one, and waits until
  // no job runs or `deadline` passes; then asks the running jobs to stop and waits at most
  // `grace` more. True when no job is running on return.
  bool Drain(absl::Time deadline, absl::Duration grace = absl::Seconds(1));

  // Calls `on_event` for every event of the job, from the first, blocking for new ones until
  // the job is done, `on_event` returns false, or `gone` (asked at least every 0.2 s while no
  // event comes) returns true: the watcher went away. A job of an earlier run replays one final
  // event. NOT_FOUND for an unknown id.
  absl::Status Watch(const std::string& id,
                     const std::function<bool(const JobEvent&)>& on_event,
                     const std::function<bool()>& gone = [] { return false; }) const;

 private:
  struct Job;
  class JobProgress;
  JobManager(Work work, storage::JobTable* table, storage::JobTable* lookup,
             absl::Status accepting, size_t max_queued, size_t max_retained);
  absl::Status Recover();
  void Start(unsigned workers);
  void WorkerLoop(int lane);
  static int LaneOf(const JobSpec& spec);  // 0: CPU workers, 1: the GPU worker
  size_t QueuedLocked() const;             // requires mu_
  void AddEvent(Job& job, JobEvent event);
  void Finish(Job& job, JobEvent last);  // requires mu_; records the job as finished
  absl::Status Store(const JobSnapshot& snapshot) const;
  // Counts one more interruption of `s` (the daemon stopped while it ran): queued again, or
  // failed once there were more than kMaxInterruptions. The message saying which.
  static std::string Interrupted(JobSnapshot& s);

  const Work work_;
  storage::JobTable* const table_;
  storage::JobTable* const lookup_;
  const absl::Status accepting_;
  const size_t max_queued_;
  const size_t max_retained_;
  mutable std::mutex table_mu_;   // serializes table_ (one SQLite connection)
  mutable std::mutex lookup_mu_;  // serializes lookup_
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // signalled on any new event, job, finish or stop
  // Shared so that a watcher keeps a job alive while it is dropped from the map.
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // guarded by mu_
  std::deque<std::shared_ptr<Job>> queues_[2];        // guarded by mu_; by LaneOf
  std::deque<std::string> finished_;                  // guarded by mu_; oldest first
  size_t running_ = 0;                                // guarded by mu_
  size_t reserved_ = 0;                               // guarded by mu_: Submits writing rows
  bool draining_ = false;                             // guarded by mu_: no new work
  bool stopping_ = false;                             // guarded by mu_: workers exit
  std::vector<std::string> recovery_notes_;           // written by Recover only
  std::vector<std::thread> workers_;
};

std::string JobStateName(JobState s);  // "queued", "running", ... as stored

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_JOB_MANAGER_H_
