#include "services/daemon/job_manager.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/environment.h"

namespace ckpt::daemon {
namespace {

constexpr JobState kAllStates[] = {JobState::kQueued,    JobState::kRunning,
                                   JobState::kSucceeded, JobState::kFailed,
                                   JobState::kCancelled, JobState::kInterrupted};

bool Finished(JobState s) { return s != JobState::kQueued && s != JobState::kRunning; }

std::string RootMapText(const std::vector<quant::RootMapping>& map) {
  std::string out;
  for (const auto& m : map) absl::StrAppend(&out, m.declared, "=", m.actual, "\n");
  return out;
}

// One line per referrer: "DIGEST PREDICATE_TYPE api|tag" (storage::JobRow::referrers).
std::string ReferrersText(const std::vector<JobReferrer>& referrers) {
  std::string out;
  for (const JobReferrer& r : referrers) {
    absl::StrAppend(&out, r.digest, " ", r.predicate_type, r.referrers_api ? " api\n" : " tag\n");
  }
  return out;
}

// The database is not trusted: a line that is not three words ending in api or tag is left
// out (nothing signed is read from here; the registry and the log say what was pushed).
std::vector<JobReferrer> ReferrersOf(const std::string& text) {
  std::vector<JobReferrer> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() != 3 || words[0].empty() || words[1].empty() ||
        (words[2] != "api" && words[2] != "tag")) {
      continue;
    }
    out.push_back({words[0], words[1], words[2] == "api"});
  }
  return out;
}

std::vector<quant::RootMapping> RootMapOf(const std::string& text) {
  std::vector<quant::RootMapping> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    auto m = quant::ParseRootMapping(std::string(line));
    if (m.ok()) out.push_back(*m);
  }
  return out;
}

storage::JobRow RowOf(const JobSnapshot& s) {
  storage::JobRow r;
  r.id = s.id;
  r.root = s.spec.root;
  r.source_root = s.spec.source_root;
  r.policy = s.spec.policy;
  r.root_map = RootMapText(s.spec.root_map);
  r.invoker = s.spec.invoker;
  r.forward_layers = s.spec.forward_layers;
  r.device = s.spec.device;
  r.emulate = s.spec.emulate;
  r.state = JobStateName(s.state);
  r.verdict = s.outcome.verdict;
  r.record_id = s.outcome.record_id;
  r.error_code = static_cast<int>(s.error.code());
  r.error_message = std::string(s.error.message());
  r.created_at = s.created_at;
  r.finished_at = s.finished_at;
  r.interruptions = s.interruptions;
  r.parts = s.spec.parts;
  r.executor_job = s.spec.executor_job;
  r.referrers = ReferrersText(s.outcome.referrers);
  return r;
}

JobSnapshot SnapshotOf(const storage::JobRow& r) {
  JobSnapshot s;
  s.id = r.id;
  s.spec.root = r.root;
  s.spec.source_root = r.source_root;
  s.spec.policy = r.policy;
  s.spec.root_map = RootMapOf(r.root_map);
  s.spec.invoker = r.invoker;
  s.spec.forward_layers = r.forward_layers;
  s.spec.device = r.device;
  s.spec.emulate = r.emulate;
  s.state = JobState::kFailed;
  for (JobState st : kAllStates) {
    if (JobStateName(st) == r.state) s.state = st;
  }
  s.outcome.verdict = r.verdict;
  s.outcome.record_id = r.record_id;
  s.outcome.referrers = ReferrersOf(r.referrers);
  s.error = absl::Status(static_cast<absl::StatusCode>(r.error_code), r.error_message);
  s.created_at = r.created_at;
  s.finished_at = r.finished_at;
  s.interruptions = r.interruptions;
  s.spec.parts = static_cast<unsigned>(std::clamp<int64_t>(r.parts, 0, 1 << 20));
  s.spec.executor_job = r.executor_job;
  return s;
}

}  // namespace

std::string JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
    case JobState::kInterrupted: return "interrupted";
  }
  return "?";
}

struct JobManager::Job {
  JobSnapshot snapshot;
  std::vector<JobEvent> events;
  std::atomic<bool> cancel{false};  // asked to stop: by CancelJob, or as the daemon stops
  bool cancelled_by_caller = false;  // guarded by mu_: CancelJob, not the daemon's stop
  bool committing = false;           // guarded by mu_: signing its record (JobRun::Commit)
};

// Turns core progress calls into job events, at most one per whole percent per phase so a
// history stays small however many units a phase has; answers Cancelled for the work.
class JobManager::JobProgress final : public JobRun {
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
  bool Cancelled() const override { return job_.cancel.load(std::memory_order_relaxed); }
  const std::string& id() const override { return job_.snapshot.id; }
  bool CancelledByCaller() const override {
    std::lock_guard<std::mutex> lock(manager_.mu_);
    return job_.cancelled_by_caller;
  }
  void Note(std::string_view phase, uint64_t done_units, uint64_t total_units,
            std::string message) override {
    manager_.AddEvent(job_, JobEvent{std::string(phase), done_units, total_units,
                                     std::move(message), false});
  }
  absl::Status SetExecutorJob(const std::string& executor_job) override {
    JobSnapshot snapshot;
    {
      std::lock_guard<std::mutex> lock(manager_.mu_);
      job_.snapshot.spec.executor_job = executor_job;
      snapshot = job_.snapshot;
    }
    return manager_.Store(snapshot);
  }
  bool Commit() override {
    std::lock_guard<std::mutex> lock(manager_.mu_);
    if (job_.cancel) return false;
    job_.committing = true;
    return true;
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

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(Work work,
                                                               storage::JobTable* table,
                                                               storage::JobTable* lookup,
                                                               absl::Status accepting,
                                                               unsigned workers,
                                                               size_t max_queued,
                                                               size_t max_retained) {
  if (accepting.ok() && (table == nullptr || lookup == nullptr)) {
    return absl::InvalidArgumentError(
        "a job manager that accepts jobs needs a job table and a read-only connection to it");
  }
  std::unique_ptr<JobManager> m(
      new JobManager(std::move(work), table, lookup, std::move(accepting), max_queued,
                     max_retained));
  if (m->accepting_.ok()) {
    if (auto s = m->Recover(); !s.ok()) return s;
  }
  m->Start(workers);
  return m;
}

JobManager::JobManager(Work work, storage::JobTable* table, storage::JobTable* lookup,
                       absl::Status accepting, size_t max_queued, size_t max_retained)
    : work_(std::move(work)),
      table_(table),
      lookup_(lookup),
      accepting_(std::move(accepting)),
      max_queued_(max_queued),
      max_retained_(max_retained) {}

absl::Status JobManager::Store(const JobSnapshot& snapshot) const {
  std::lock_guard<std::mutex> lock(table_mu_);
  return table_->Update(RowOf(snapshot));
}

std::string JobManager::Interrupted(JobSnapshot& s) {
  ++s.interruptions;
  if (s.interruptions <= kMaxInterruptions) {
    s.state = JobState::kQueued;
    return absl::StrCat("the daemon stopped while this job ran (interruption ", s.interruptions,
                        " of at most ", kMaxInterruptions, "); it runs again");
  }
  s.state = JobState::kFailed;
  s.finished_at = evidence::Rfc3339Now();
  s.error = absl::AbortedError(absl::StrCat(
      "interrupted ", s.interruptions, " times: the daemon stopped (crash, kill, power loss or "
      "shutdown) each time while this job ran; it is not run again, since a job that stops the "
      "daemon would keep stopping it. A record a run finished signing is in the log; submit the "
      "job again to retry"));
  return std::string(s.error.message());
}

absl::Status JobManager::Recover() {
  absl::StatusOr<std::vector<storage::JobRow>> rows;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    rows = table_->Unfinished();
  }
  if (!rows.ok()) return rows.status();
  for (const storage::JobRow& row : *rows) {
    auto job = std::make_shared<Job>();
    job->snapshot = SnapshotOf(row);
    JobSnapshot& s = job->snapshot;
    std::string note;
    if (!row.authentic) {
      // Never run: its request and invoker would be signed into a record.
      s.state = JobState::kFailed;
      s.finished_at = evidence::Rfc3339Now();
      s.error = absl::PermissionDeniedError(
          "refused at start: this job's row in the database is not one the daemon wrote (its "
          "authentication code does not verify: inserted or changed by another writer of the "
          "file, written before job rows were authenticated, or under another signing key); "
          "it was not run");
      note = std::string(s.error.message());
    } else if (s.state == JobState::kRunning) {
      note = Interrupted(s);
    }
    if (!note.empty()) {
      recovery_notes_.push_back(absl::StrCat("job ", s.id, ": ", note));
      if (auto st = Store(s); !st.ok()) return st;
      if (s.state != JobState::kQueued) continue;  // Get answers from the table
    }
    job->events.push_back(JobEvent{"queued", 0, 0,
                                   note.empty() ? "recovered after a restart" : note, false});
    queues_[LaneOf(s.spec)].push_back(job);
    jobs_.emplace(s.id, std::move(job));
  }
  return absl::OkStatus();
}

int JobManager::LaneOf(const JobSpec& spec) { return spec.device == "cuda" ? 1 : 0; }

size_t JobManager::QueuedLocked() const { return queues_[0].size() + queues_[1].size(); }

void JobManager::Start(unsigned workers) {
  for (unsigned i = 0; i < std::max(1u, workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(0); });
  }
  workers_.emplace_back([this] { WorkerLoop(1); });  // one GPU job at a time
}

JobManager::~JobManager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = draining_ = true;
    for (auto& [id, job] : jobs_) {
      if (job->snapshot.state == JobState::kRunning) job->cancel = true;
    }
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

absl::StatusOr<std::string> JobManager::Submit(JobSpec spec) {
  if (!accepting_.ok()) return accepting_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("the daemon is shutting down");
    if (QueuedLocked() + reserved_ >= max_queued_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(QueuedLocked(), " audits already queued; try again later"));
    }
    ++reserved_;  // a queue slot, held while the row is written
  }
  auto job = std::make_shared<Job>();
  job->snapshot.spec = std::move(spec);
  job->snapshot.created_at = evidence::Rfc3339Now();
  storage::JobRow row = RowOf(job->snapshot);
  absl::Status inserted;
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    inserted = table_->Insert(row);
  }
  job->snapshot.id = row.id;
  job->events.push_back(JobEvent{"queued", 0, 0, "", false});
  {
    std::lock_guard<std::mutex> lock(mu_);
    --reserved_;
    if (!inserted.ok()) return inserted;
    queues_[LaneOf(job->snapshot.spec)].push_back(job);
    jobs_.emplace(row.id, std::move(job));
  }
  cv_.notify_all();
  return row.id;
}

absl::StatusOr<JobSnapshot> JobManager::Get(const std::string& id) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) return it->second->snapshot;
  }
  if (lookup_ == nullptr) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(lookup_mu_);
  auto row = lookup_->Get(id);
  if (!row.ok()) return row.status();
  return SnapshotOf(*row);
}

absl::StatusOr<JobSnapshot> JobManager::Cancel(const std::string& id) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it != jobs_.end()) job = it->second;
  }
  if (!job) {
    auto snapshot = Get(id);  // a job of an earlier run: finished, or NOT_FOUND
    if (!snapshot.ok()) return snapshot.status();
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " already finished (", JobStateName(snapshot->state), ")"));
  }
  JobSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Finished(job->snapshot.state)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " already finished (", JobStateName(job->snapshot.state), ")"));
    }
    if (job->committing) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is signing its record: too late to cancel"));
    }
    job->cancel = true;
    job->cancelled_by_caller = true;
    if (job->snapshot.state == JobState::kQueued) {
      std::erase(queues_[LaneOf(job->snapshot.spec)], job);
      job->snapshot.state = JobState::kCancelled;
      job->snapshot.error = absl::CancelledError("cancelled before it started");
      job->snapshot.finished_at = evidence::Rfc3339Now();
    }
    snapshot = job->snapshot;
  }
  if (snapshot.state == JobState::kCancelled) {
    absl::Status stored = Store(snapshot);  // stored before any watcher hears of it
    {
      std::lock_guard<std::mutex> lock(mu_);
      Finish(*job, JobEvent{"cancelled", 0, 0, "cancelled before it started", true});
    }
    cv_.notify_all();
    if (!stored.ok()) return stored;
  }
  return snapshot;
}

bool JobManager::Drain(absl::Time deadline, absl::Duration grace) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  cv_.notify_all();
  auto idle = [&] { return running_ == 0; };
  auto until = [](absl::Time t) { return absl::ToChronoTime(t); };
  if (cv_.wait_until(lock, until(deadline), idle)) return true;
  for (auto& [id, job] : jobs_) {
    if (job->snapshot.state == JobState::kRunning) job->cancel = true;
  }
  return cv_.wait_until(lock, until(absl::Now() + grace), idle);
}

JobCounts JobManager::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  JobCounts c;
  c.queued = QueuedLocked();
  c.running = running_;
  return c;
}

absl::Status JobManager::Watch(const std::string& id,
                               const std::function<bool(const JobEvent&)>& on_event,
                               const std::function<bool()>& gone) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    lock.unlock();
    auto snapshot = Get(id);
    if (!snapshot.ok()) return snapshot.status();
    on_event(JobEvent{JobStateName(snapshot->state), 0, 0,
                      std::string(snapshot->error.message()), true});
    return absl::OkStatus();
  }
  const std::shared_ptr<const Job> held = it->second;
  const Job& job = *held;
  size_t next = 0;
  for (;;) {
    // A queued job may have no news for hours: a watcher that left must not wait that long.
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200),
                         [&] { return next < job.events.size(); })) {
      if (gone()) return absl::OkStatus();
    }
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

void JobManager::Finish(Job& job, JobEvent last) {
  job.snapshot.spec.root_dir.reset();
  job.snapshot.spec.source_dir.reset();
  job.events.push_back(std::move(last));
  finished_.push_back(job.snapshot.id);
  while (finished_.size() > max_retained_) {
    jobs_.erase(finished_.front());
    finished_.pop_front();
  }
}

void JobManager::WorkerLoop(int lane) {
  std::deque<std::shared_ptr<Job>>& queue = queues_[lane];
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || (!draining_ && !queue.empty()); });
      if (stopping_) return;
      job = queue.front();
      queue.pop_front();
      job->snapshot.state = JobState::kRunning;
      ++running_;
    }
    // A job whose state cannot be stored still runs: its record, if any, is in the log.
    Store(job->snapshot).IgnoreError();
    JobProgress progress(*this, *job);
    absl::StatusOr<JobOutcome> outcome = work_(job->snapshot.spec, progress);
    JobSnapshot snapshot;
    JobEvent last{"done", 0, 0, "", true};
    {
      std::lock_guard<std::mutex> lock(mu_);
      JobSnapshot& s = job->snapshot;
      s.finished_at = evidence::Rfc3339Now();
      if (outcome.ok()) {
        s.state = JobState::kSucceeded;
        s.outcome = *outcome;
        s.error = outcome->attach;
        last.message = absl::StrCat("verdict ", outcome->verdict, ", record ", outcome->record_id);
        if (!s.error.ok()) absl::StrAppend(&last.message, "; ", s.error.ToString());
      } else if (job->cancel && !job->cancelled_by_caller &&
                 absl::IsCancelled(outcome.status())) {
        // Stopped because the daemon stops: queued again for its next start, or failed.
        s.finished_at.clear();
        last.message = Interrupted(s);
        last.phase = JobStateName(s.state);
      } else {
        bool cancelled = job->cancel && absl::IsCancelled(outcome.status());
        s.state = cancelled ? JobState::kCancelled : JobState::kFailed;
        s.error = outcome.status();
        last.phase = cancelled ? "cancelled" : "done";
        last.message = outcome.status().ToString();
      }
      snapshot = s;
    }
    // Stored before the last event, so a watcher that saw the end finds it after a crash too.
    Store(snapshot).IgnoreError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      Finish(*job, std::move(last));
      --running_;
    }
    cv_.notify_all();
  }
}

}  // namespace ckpt::daemon
