#include "services/daemon/job_manager.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/evidence/environment.h"

namespace ckpt::daemon {
struct JobManager::Job {
  JobSnapshot snapshot;
  std::vector<JobEvent> events;
};

// Turns core progress calls into job events, at most one per whole percent per phase so a
// history stays small however many units a phase has.
class JobManager::JobProgress final : public Progress {
 public:
  JobProgress(JobManager& manager, Job& job) : manager_(manager), job_(job) {}
  void Begin(std::string_view phase, uint64_t total_units) override {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = std::string(phase);
    total_ = total_units;
    done_ = 0;
    last_percent_ = -1;
    Emit();
  }
  void Advance(uint64_t units) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ += units;
    if (Percent() != last_percent_) Emit();
  }
  void End() override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = total_;
    Emit();
  }

 private:
  int Percent() const {
    return total_ == 0 ? 100 : static_cast<int>(std::min(done_, total_) * 100 / total_);
  }
  void Emit() {
    last_percent_ = Percent();
    manager_.AddEvent(job_, JobEvent{phase_, done_, total_, "", false});
  }
  JobManager& manager_;
  Job& job_;
  std::mutex mu_;
  std::string phase_;
  uint64_t total_ = 0, done_ = 0;
  int last_percent_ = -1;
};

JobManager::JobManager(Work work, unsigned workers, size_t max_queued, size_t max_retained)
    : work_(std::move(work)), max_queued_(max_queued), max_retained_(max_retained) {
  for (unsigned i = 0; i < std::max(1u, workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

JobManager::~JobManager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (const std::shared_ptr<Job>& job : queue_) {
      job->snapshot.state = JobState::kFailed;
      job->snapshot.error = absl::CancelledError("the daemon stopped before the job started");
      job->snapshot.finished_at = evidence::Rfc3339Now();
      job->events.push_back(JobEvent{"cancelled", 0, 0, "daemon stopping", true});
    }
    queue_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

absl::StatusOr<std::string> JobManager::Submit(JobSpec spec) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return absl::UnavailableError("the daemon is stopping");
  if (queue_.size() >= max_queued_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(queue_.size(), " audits already queued; try again later"));
  }
  auto job = std::make_shared<Job>();
  job->snapshot.id = absl::StrFormat("job-%06d", next_id_++);
  job->snapshot.spec = std::move(spec);
  job->snapshot.created_at = evidence::Rfc3339Now();
  job->events.push_back(JobEvent{"queued", 0, 0, "", false});
  std::string id = job->snapshot.id;
  queue_.push_back(job);
  jobs_.emplace(id, std::move(job));
  cv_.notify_all();
  return id;
}

absl::StatusOr<JobSnapshot> JobManager::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  return it->second->snapshot;
}

JobCounts JobManager::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  JobCounts c;
  c.queued = queue_.size();
  for (const auto& [id, job] : jobs_) c.running += job->snapshot.state == JobState::kRunning;
  return c;
}

absl::Status JobManager::Watch(const std::string& id,
                               const std::function<bool(const JobEvent&)>& on_event) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", id));
  const std::shared_ptr<const Job> held = it->second;
  const Job& job = *held;
  size_t next = 0;
  for (;;) {
    cv_.wait(lock, [&] { return next < job.events.size(); });
    std::vector<JobEvent> batch(job.events.begin() + static_cast<std::ptrdiff_t>(next),
                                job.events.end());
    next = job.events.size();
    lock.unlock();  // never call out with the lock held
    for (const JobEvent& e : batch) {
      if (!on_event(e)) return absl::OkStatus();
      if (e.done) return absl::OkStatus();
    }
    lock.lock();
  }
}

void JobManager::AddEvent(Job& job, JobEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job.events.push_back(std::move(event));
  }
  cv_.notify_all();
}

void JobManager::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      job = queue_.front();
      queue_.pop_front();
      job->snapshot.state = JobState::kRunning;
    }
    JobProgress progress(*this, *job);
    absl::StatusOr<JobOutcome> outcome = work_(job->snapshot.spec, progress);
    JobEvent last{"done", 0, 0, "", true};
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->snapshot.finished_at = evidence::Rfc3339Now();
      if (outcome.ok()) {
        job->snapshot.state = JobState::kSucceeded;
        job->snapshot.outcome = *outcome;
        last.message = absl::StrCat("verdict ", outcome->verdict, ", record ", outcome->record_id);
      } else {
        job->snapshot.state = JobState::kFailed;
        job->snapshot.error = outcome.status();
        last.message = outcome.status().ToString();
      }
      job->events.push_back(std::move(last));
      finished_.push_back(job->snapshot.id);
      while (finished_.size() > max_retained_) {
        jobs_.erase(finished_.front());
        finished_.pop_front();
      }
    }
    cv_.notify_all();
  }
}

}  // namespace ckpt::daemon
