// Audit jobs for the daemon: a bounded queue, a fixed set of worker threads, and per-job event
// histories that any number of watchers can follow (late watchers replay from the start).
//
// No gRPC in here: the AuditService adapter turns these events into stream messages, and tests
// drive the manager directly. Thread-safe; all state is guarded by mu_.
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
#include "core/progress.h"

namespace ckpt::daemon {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed };

struct JobSpec {
  std::string root;
  std::string source_root;
  std::string policy;
  std::string invoker;  // who asked (auth.h Caller::Invoker()); recorded in the record
};

// What a finished audit reports back.
struct JobOutcome {
  std::string verdict;  // "pass" / "fail"
  int64_t record_id = -1;
  uint64_t bytes_read = 0;  // bytes the audit read from storage (both trees of a pair)
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
  absl::Status error;  // set when kFailed
  std::string created_at, finished_at;
};

struct JobEvent {
  std::string phase;
  uint64_t done_units = 0;
  uint64_t total_units = 0;
  std::string message;
  bool done = false;  // the last event of the job
};

class JobManager {
 public:
  using Work = std::function<absl::StatusOr<JobOutcome>(const JobSpec&, Progress&)>;

  // `workers` audits run at once; at most `max_queued` wait (RESOURCE_EXHAUSTED beyond); the
  // newest `max_retained` finished jobs stay queryable (older ones are NOT_FOUND; their
  // outcomes are in the evidence log).
  JobManager(Work work, unsigned workers, size_t max_queued, size_t max_retained = 1024);
  ~JobManager();  // stops accepting, lets running jobs finish, drops queued ones as failed
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  absl::StatusOr<std::string> Submit(JobSpec spec);
  absl::StatusOr<JobSnapshot> Get(const std::string& id) const;
  JobCounts Counts() const;

  // Calls `on_event` for every event of the job, from the first, blocking for new ones until
  // the job is done or `on_event` returns false (the watcher went away). NOT_FOUND for an
  // unknown id.
  absl::Status Watch(const std::string& id,
                     const std::function<bool(const JobEvent&)>& on_event) const;

 private:
  struct Job;
  class JobProgress;
  void WorkerLoop();
  void AddEvent(Job& job, JobEvent event);

  const Work work_;
  const size_t max_queued_;
  const size_t max_retained_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // signalled on any new event, job, or shutdown
  // Shared so that a watcher keeps a job alive while it is dropped from the map.
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // guarded by mu_
  std::deque<std::shared_ptr<Job>> queue_;            // guarded by mu_
  std::deque<std::string> finished_;                  // guarded by mu_; oldest first
  bool stopping_ = false;                             // guarded by mu_
  uint64_t next_id_ = 1;                              // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_JOB_MANAGER_H_
