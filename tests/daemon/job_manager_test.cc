// The job manager: event histories, bounded queue, cancellation, and durability through the
// jobs table of a real evidence database (recovery after a stop, re-runs of interrupted jobs at
// most 3 times, rows the daemon did not write never run, ids that never repeat).
#include "services/daemon/job_manager.h"

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/evidence_log.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

// A job that reports 4 progress steps, then blocks until released (or cancelled).
struct GatedWork {
  std::promise<void> release;
  std::shared_future<void> released{release.get_future().share()};
  absl::StatusOr<JobOutcome> operator()(const JobSpec& spec, Progress& p) {
    p.Begin("work", 4);
    for (int i = 0; i < 4; ++i) p.Advance(1);
    p.End();
    // Polls for cancellation the way the audit engine does, in bounded steps.
    while (released.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      if (p.Cancelled()) return absl::CancelledError("stopped");
    }
    if (spec.root == "bad") return absl::InvalidArgumentError("bad root");
    if (spec.root == "attach-fails") {
      return JobOutcome{"pass", 7, 0, absl::UnavailableError("registry down")};
    }
    return JobOutcome{"pass", 7};
  }
};

// A fresh evidence database (schema with the jobs table) and a connection to its jobs.
class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (dir_ / "ev.db").string();
    ASSERT_TRUE(storage::EvidenceLog::Open(path_, /*create=*/true).ok());
    table_ = OpenTable();
    lookup_ = OpenTable(/*read_only=*/true);
    rows_ = OpenTable(/*read_only=*/true);
  }
  std::unique_ptr<storage::JobTable> OpenTable(bool read_only = false) {
    auto t = storage::JobTable::Open(path_, "evidence log",
                                     read_only ? std::nullopt : std::optional(kKey));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }
  std::unique_ptr<JobManager> Manager(GatedWork& work, size_t max_queued = 4,
                                      size_t max_retained = 1024,
                                      storage::JobTable* table = nullptr) {
    auto m = JobManager::Create([&](const JobSpec& s, Progress& p) { return work(s, p); },
                                table ? table : table_.get(), lookup_.get(), absl::OkStatus(), 1,
                                max_queued, max_retained);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  static void WaitDone(JobManager& jobs, const std::string& id) {
    ASSERT_TRUE(jobs.Watch(id, [](const JobEvent&) { return true; }).ok());
  }

  // The stored row of `id`, read on a connection no manager uses: a JobTable is not
  // thread-safe (storage/job_table.h), and a manager's worker may be writing through table_.
  storage::JobRow Stored(const std::string& id) {
    auto row = rows_->Get(id);
    EXPECT_TRUE(row.ok()) << id << ": " << row.status();
    return row.ok() ? *std::move(row) : storage::JobRow{};
  }

  // Rows as a killed daemon leaves them: the job `id` was running.
  void MarkRunning(const std::string& id, int64_t interruptions = 0) {
    auto row = table_->Get(id);
    ASSERT_TRUE(row.ok()) << row.status();
    row->state = "running";
    row->interruptions = interruptions;
    ASSERT_TRUE(table_->Update(*row).ok());
  }

  static constexpr storage::JobRowKey kKey = {7, 7, 7};
  TempDir dir_;
  std::string path_;
  std::unique_ptr<storage::JobTable> table_;
  std::unique_ptr<storage::JobTable> lookup_;
  std::unique_ptr<storage::JobTable> rows_;  // the test's own reads (Stored)
};

TEST_F(JobManagerTest, LateWatcherReplaysHistoryAndSeesOutcome) {
  GatedWork work;
  auto jobs = Manager(work);
  auto id = jobs->Submit({"root", "", "scale-window"});
  ASSERT_TRUE(id.ok());
  work.release.set_value();
  std::vector<JobEvent> events;
  ASSERT_TRUE(jobs->Watch(*id, [&](const JobEvent& e) {
    events.push_back(e);
    return true;
  }).ok());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().phase, "queued");
  EXPECT_TRUE(events.back().done);
  EXPECT_THAT(events.back().message, HasSubstr("record 7"));
  bool saw_full = false;
  for (const auto& e : events) saw_full |= e.phase == "work" && e.done_units == 4;
  EXPECT_TRUE(saw_full);
  auto snap = jobs->Get(*id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->state, JobState::kSucceeded);
  EXPECT_EQ(snap->outcome.record_id, 7);
  EXPECT_FALSE(snap->finished_at.empty());
}

TEST_F(JobManagerTest, FailedJobKeepsItsStatus) {
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work);
  auto id = jobs->Submit({"bad", "", ""});
  ASSERT_TRUE(id.ok());
  WaitDone(*jobs, *id);
  auto snap = jobs->Get(*id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->state, JobState::kFailed);
  EXPECT_EQ(snap->error.code(), absl::StatusCode::kInvalidArgument);
}

// --attach failed after the record was signed: the job succeeded, with its record, and says why
// nothing was attached, in memory, in its last event and in its stored row.
TEST_F(JobManagerTest, AttachErrorOfASucceededJobIsKept) {
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work);
  auto id = jobs->Submit({"attach-fails", "", ""});
  ASSERT_TRUE(id.ok());
  std::string last;
  ASSERT_TRUE(jobs->Watch(*id, [&](const JobEvent& e) {
    last = e.message;
    return true;
  }).ok());
  EXPECT_THAT(last, HasSubstr("verdict pass, record 7; UNAVAILABLE: registry down"));
  auto snap = jobs->Get(*id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->state, JobState::kSucceeded);
  EXPECT_EQ(snap->outcome.record_id, 7);
  EXPECT_EQ(snap->error, absl::UnavailableError("registry down"));
  auto row = rows_->Get(*id);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->state, "succeeded");
  EXPECT_EQ(row->record_id, 7);
  EXPECT_EQ(row->error_code, static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(row->error_message, "registry down");
}

TEST_F(JobManagerTest, QueueIsBounded) {
  GatedWork work;
  auto jobs = Manager(work, /*max_queued=*/2);
  // One job runs (blocked), two wait; the fourth is refused.
  for (int i = 0; i < 3; ++i) {
    auto id = jobs->Submit({"root", "", ""});
    ASSERT_TRUE(id.ok()) << id.status();
    if (i == 0) {  // make sure the first job left the queue before counting
      jobs->Watch(*id, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();
    }
  }
  auto refused = jobs->Submit({"root", "", ""});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(jobs->Get("job-999999").status().code(), absl::StatusCode::kNotFound);
  work.release.set_value();
}

TEST_F(JobManagerTest, WatcherCanStopEarly) {
  GatedWork work;
  auto jobs = Manager(work);
  auto id = jobs->Submit({"root", "", ""});
  ASSERT_TRUE(id.ok());
  int seen = 0;
  ASSERT_TRUE(jobs->Watch(*id, [&](const JobEvent&) { return ++seen < 2; }).ok());
  EXPECT_EQ(seen, 2);
  work.release.set_value();
}

// Event histories are bounded in memory; the jobs themselves stay answerable from the table.
TEST_F(JobManagerTest, OldFinishedJobsAnswerFromTheTable) {
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work, 8, /*max_retained=*/2);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = jobs->Submit({"root", "", ""});
    ASSERT_TRUE(id.ok());
    WaitDone(*jobs, *id);
    ids.push_back(*id);
  }
  for (const std::string& id : ids) {
    auto snap = jobs->Get(id);
    ASSERT_TRUE(snap.ok()) << id;
    EXPECT_EQ(snap->state, JobState::kSucceeded);
    EXPECT_EQ(snap->outcome.record_id, 7);
  }
  std::vector<JobEvent> replay;
  ASSERT_TRUE(jobs->Watch(ids[0], [&](const JobEvent& e) {
    replay.push_back(e);
    return true;
  }).ok());
  ASSERT_EQ(replay.size(), 1u);
  EXPECT_TRUE(replay[0].done);
}

TEST_F(JobManagerTest, CancelQueuedAndRunningJobs) {
  GatedWork work;
  auto jobs = Manager(work);
  auto running = jobs->Submit({"root", "", ""});
  auto queued = jobs->Submit({"root", "", ""});
  ASSERT_TRUE(running.ok() && queued.ok());
  jobs->Watch(*running, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();

  auto q = jobs->Cancel(*queued);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->state, JobState::kCancelled);
  auto r = jobs->Cancel(*running);
  ASSERT_TRUE(r.ok()) << r.status();
  WaitDone(*jobs, *running);  // the work polls Cancelled and stops
  EXPECT_EQ(jobs->Get(*running)->state, JobState::kCancelled);
  EXPECT_EQ(jobs->Cancel(*running).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs->Cancel("job-nope").status().code(), absl::StatusCode::kNotFound);
  // The cancelled states are stored.
  auto table = OpenTable();
  EXPECT_EQ(table->Get(*queued)->state, "cancelled");
  EXPECT_EQ(table->Get(*running)->state, "cancelled");
}

// A kill with jobs in flight: the running one is recorded as running and the queued ones as
// queued. A new manager runs all three again, the interrupted one first (submission order).
TEST_F(JobManagerTest, RerunsInterruptedAndQueuedJobsAfterAKill) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    storage::JobRow row;
    row.root = absl::StrCat("root", i);
    row.created_at = "2026-01-01T00:00:00.000Z";
    ASSERT_TRUE(table_->Insert(row).ok());
    ids.push_back(row.id);
  }
  MarkRunning(ids[0]);
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work);
  for (int i = 0; i < 3; ++i) {
    WaitDone(*jobs, ids[i]);
    auto snap = jobs->Get(ids[i]);
    ASSERT_TRUE(snap.ok());
    EXPECT_EQ(snap->state, JobState::kSucceeded) << ids[i] << " " << snap->error;
    EXPECT_EQ(snap->spec.root, absl::StrCat("root", i));
    EXPECT_EQ(Stored(ids[i]).interruptions, i == 0 ? 1 : 0);
  }
  ASSERT_EQ(jobs->recovery_notes().size(), 1u);
  EXPECT_THAT(jobs->recovery_notes()[0], HasSubstr(ids[0]));
  EXPECT_THAT(jobs->recovery_notes()[0], HasSubstr("interruption 1 of at most 3"));
  // Ids never repeat: a new table connection (a restart) issues fresh ones.
  auto fresh = jobs->Submit({"root", "", ""});
  ASSERT_TRUE(fresh.ok());
  std::set<std::string> all(ids.begin(), ids.end());
  EXPECT_TRUE(all.insert(*fresh).second) << *fresh;
}

// A job interrupted a fourth time (here: three stops that ended it, then a kill) is not run
// again. It ends FAILED, and GetJob and WatchJob say why; never silently.
TEST_F(JobManagerTest, AJobInterruptedAFourthTimeFailsWithTheReason) {
  storage::JobRow row;
  row.root = "root";
  row.created_at = "2026-01-01T00:00:00.000Z";
  ASSERT_TRUE(table_->Insert(row).ok());
  for (int stops = 1; stops <= 3; ++stops) {
    GatedWork blocked;  // runs until the stop asks it to stop
    auto jobs = Manager(blocked);
    jobs->Watch(row.id, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();
    ASSERT_EQ(jobs->Get(row.id)->state, JobState::kRunning) << "run " << stops;
    EXPECT_TRUE(jobs->Drain(absl::Now()));
    EXPECT_EQ(Stored(row.id).state, "queued");
    EXPECT_EQ(Stored(row.id).interruptions, stops);
  }
  MarkRunning(row.id, 3);  // the fourth run, killed
  GatedWork work;
  work.release.set_value();
  int runs = 0;
  auto m = JobManager::Create(
      [&](const JobSpec& s, Progress& p) {
        ++runs;
        return work(s, p);
      },
      table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  auto failed = (*m)->Get(row.id);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->state, JobState::kFailed);
  EXPECT_EQ(failed->error.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed->error.message(), HasSubstr("interrupted 4 times"));
  std::vector<JobEvent> replay;
  ASSERT_TRUE((*m)->Watch(row.id, [&](const JobEvent& e) {
    replay.push_back(e);
    return true;
  }).ok());
  ASSERT_EQ(replay.size(), 1u);
  EXPECT_EQ(replay[0].phase, "failed");
  EXPECT_THAT(replay[0].message, HasSubstr("interrupted 4 times"));
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(Stored(row.id).state, "failed");
  EXPECT_EQ(Stored(row.id).interruptions, 4);
}

// Whoever can write the database file can insert a job row, or drop the triggers and change a
// row's request. Neither runs: its invoker would be signed into a record. A genuine queued job
// beside them still runs.
TEST_F(JobManagerTest, RowsTheDaemonDidNotWriteAreNeverRun) {
  storage::JobRow genuine, altered, resplit;
  genuine.root = altered.root = resplit.root = "root";
  genuine.invoker = altered.invoker = resplit.invoker = "auditor:ci";
  genuine.created_at = altered.created_at = resplit.created_at = "2026-01-01T00:00:00.000Z";
  resplit.parts = 2;
  ASSERT_TRUE(table_->Insert(genuine).ok());
  ASSERT_TRUE(table_->Insert(altered).ok());
  ASSERT_TRUE(table_->Insert(resplit).ok());
  {
    ::ckpt::testing::RawDb raw(path_);
    ASSERT_EQ(raw.Exec("INSERT INTO jobs(seq, id, root, source_root, policy, root_map, invoker,"
                       " state, verdict, record_id, error_code, error_message, created_at,"
                       " finished_at, mac) VALUES(100, 'job-000100-forged00', 'root', '', '', '',"
                       " 'admin:release-manager', 'queued', '', -1, 0, '',"
                       " '2026-01-01T00:00:00.000Z', '', '" + genuine.mac + "')"),
              0)
        << raw.error();
    ASSERT_EQ(raw.Exec("DROP TRIGGER jobs_request_fixed"), 0) << raw.error();
    ASSERT_EQ(raw.Exec("UPDATE jobs SET invoker = 'admin:release-manager' WHERE id = '" +
                       altered.id + "'"),
              0)
        << raw.error();
    // The part count is authenticated too (schema 5).
    ASSERT_EQ(raw.Exec("UPDATE jobs SET parts = 3 WHERE id = '" + resplit.id + "'"), 0)
        << raw.error();
  }
  GatedWork work;
  work.release.set_value();
  std::mutex mu;
  std::vector<std::string> ran;
  auto m = JobManager::Create(
      [&](const JobSpec& s, Progress& p) {
        {
          std::lock_guard<std::mutex> lock(mu);
          ran.push_back(s.invoker);
        }
        return work(s, p);
      },
      table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  JobManager& jobs = **m;
  WaitDone(jobs, genuine.id);
  EXPECT_EQ(jobs.Get(genuine.id)->state, JobState::kSucceeded);
  for (const std::string& id : {std::string("job-000100-forged00"), altered.id, resplit.id}) {
    auto refused = jobs.Get(id);
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->state, JobState::kFailed) << id;
    EXPECT_EQ(refused->error.code(), absl::StatusCode::kPermissionDenied) << id;
    EXPECT_THAT(refused->error.message(), HasSubstr("not one the daemon wrote"));
    EXPECT_EQ(Stored(id).state, "failed");
  }
  EXPECT_THAT(ran, ::testing::ElementsAre("auditor:ci"));
  ASSERT_EQ(jobs.recovery_notes().size(), 3u);
  EXPECT_THAT(jobs.recovery_notes()[0], HasSubstr(altered.id));
  EXPECT_THAT(jobs.recovery_notes()[1], HasSubstr(resplit.id));
  EXPECT_THAT(jobs.recovery_notes()[2], HasSubstr("job-000100-forged00"));
}

// A Slurm job's part count and array job id are stored with it; a job recovered after a restart
// gets both back, so it follows its array instead of submitting another (docs/daemon.md "Slurm
// executor"). The work tells CancelJob from the daemon's stop.
TEST_F(JobManagerTest, ExecutorJobIsStoredAndRecovered) {
  std::string id;
  {
    std::promise<void> stored;
    auto m = JobManager::Create(
        [&](const JobSpec& s, JobRun& run) -> absl::StatusOr<JobOutcome> {
          EXPECT_EQ(s.parts, 3u);
          EXPECT_TRUE(run.SetExecutorJob("4242").ok());
          EXPECT_EQ(s.executor_job, "4242");
          stored.set_value();
          while (!run.Cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          EXPECT_FALSE(run.CancelledByCaller());
          return absl::CancelledError("the daemon stops");
        },
        table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
    ASSERT_TRUE(m.ok()) << m.status();
    JobSpec spec{"root", "", "scale-window"};
    spec.parts = 3;
    auto submitted = (*m)->Submit(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    id = *submitted;
    stored.get_future().wait();
    EXPECT_EQ(Stored(id).executor_job, "4242");
    EXPECT_EQ(Stored(id).parts, 3);
  }  // the daemon stops while the job runs
  std::promise<JobSpec> seen;
  bool by_caller = false;
  auto m = JobManager::Create(
      [&](const JobSpec& s, JobRun& run) -> absl::StatusOr<JobOutcome> {
        seen.set_value(s);
        while (!run.Cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        by_caller = run.CancelledByCaller();
        return absl::CancelledError("cancelled");
      },
      table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  JobSpec recovered = seen.get_future().get();
  EXPECT_EQ(recovered.parts, 3u);
  EXPECT_EQ(recovered.executor_job, "4242");
  ASSERT_TRUE((*m)->Cancel(id).ok());
  WaitDone(**m, id);
  EXPECT_TRUE(by_caller);
  EXPECT_EQ((*m)->Get(id)->state, JobState::kCancelled);
}

// The referrers --attach pushed are stored with the job and answered after a restart; the
// column is not trusted: a line that is not "DIGEST PREDICATE_TYPE api|tag" is left out.
TEST_F(JobManagerTest, AttachedReferrersAreStoredAndAnsweredAfterARestart) {
  const std::vector<JobReferrer> pushed = {
      {"sha256:" + std::string(64, 'a'), "https://slsa.dev/verification_summary/v1", false},
      {"sha256:" + std::string(64, 'b'), "https://in-toto.io/attestation/test-result/v0.1",
       true}};
  std::string id;
  {
    auto m = JobManager::Create(
        [&](const JobSpec&, JobRun&) -> absl::StatusOr<JobOutcome> {
          JobOutcome o{"pass", 7};
          o.referrers = pushed;
          return o;
        },
        table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
    ASSERT_TRUE(m.ok()) << m.status();
    auto submitted = (*m)->Submit(JobSpec{"root", "", "scale-window"});
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    id = *submitted;
    WaitDone(**m, id);
    EXPECT_EQ((*m)->Get(id)->outcome.referrers, pushed);
  }
  EXPECT_EQ(Stored(id).referrers,
            "sha256:" + std::string(64, 'a') + " https://slsa.dev/verification_summary/v1 tag\n"
            "sha256:" + std::string(64, 'b') +
                " https://in-toto.io/attestation/test-result/v0.1 api\n");
  GatedWork work;
  auto restarted = Manager(work);
  ASSERT_NE(restarted, nullptr);
  auto after = restarted->Get(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state, JobState::kSucceeded);
  EXPECT_EQ(after->outcome.referrers, pushed);

  ::ckpt::testing::RawDb raw(path_);
  ASSERT_EQ(raw.Exec("UPDATE jobs SET referrers = 'sha256:1 p api extra\nsha256:2 p maybe\n"
                     " p api\nsha256:3 p tag\n' WHERE id = '" + id + "'"),
            0)
      << raw.error();
  after = restarted->Get(id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->outcome.referrers, (std::vector<JobReferrer>{{"sha256:3", "p", false}}));
}

// Looking up a job of an earlier run reads through its own read-only connection: while another
// process holds SQLite's write lock and a Submit waits for it, Get still answers (the daemon's
// GetJob runs on gRPC's few callback threads, docs/daemon.md "Threads and memory").
TEST_F(JobManagerTest, LookupsNeverWaitForAWrite) {
  storage::JobRow old;
  old.root = "root";
  old.created_at = "2026-01-01T00:00:00.000Z";
  ASSERT_TRUE(table_->Insert(old).ok());
  old.state = "succeeded";
  ASSERT_TRUE(table_->Update(old).ok());
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work);
  ::ckpt::testing::RawDb other(path_);
  ASSERT_EQ(other.Exec("BEGIN IMMEDIATE"), 0) << other.error();  // as another writer would
  auto submit = std::async(std::launch::async, [&] { return jobs->Submit({"root", "", ""}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the Submit waits for the lock
  auto found = jobs->Get(old.id);
  EXPECT_EQ(submit.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "Get answered only once the Submit's write had ended";
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->state, JobState::kSucceeded);
  ASSERT_EQ(other.Exec("COMMIT"), 0) << other.error();
  auto submitted = submit.get();
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  WaitDone(*jobs, *submitted);
}

TEST_F(JobManagerTest, QueuedJobsSurviveAStopAndRunAfterIt) {
  std::string first, second;
  {
    GatedWork blocked;
    auto jobs = Manager(blocked);
    first = *jobs->Submit({"root", "", ""});
    second = *jobs->Submit({"root", "", ""});
    jobs->Watch(first, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();
    // The deadline has passed at once: the running job is asked to stop, and its work (which
    // polls) does; the queued job is not started.
    EXPECT_TRUE(jobs->Drain(absl::Now()));
  }  // the queued job stays queued in the table
  // The job the stop ended is queued again, one interruption counted.
  auto table = OpenTable();
  EXPECT_EQ(table->Get(first)->state, "queued");
  EXPECT_EQ(table->Get(first)->interruptions, 1);
  EXPECT_EQ(table->Get(second)->state, "queued");
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work, 4, 1024, table.get());
  WaitDone(*jobs, first);
  WaitDone(*jobs, second);
  EXPECT_EQ(jobs->Get(first)->state, JobState::kSucceeded);
  EXPECT_EQ(jobs->Get(second)->state, JobState::kSucceeded);
}

// GPU jobs have a lane of their own: a running GPU job holds the GPU worker (the next GPU job
// waits) while CPU jobs still run; the forward request survives a restart.
TEST_F(JobManagerTest, GpuJobsRunOneAtATimeBesideCpuJobs) {
  std::promise<void> release_gpu;
  std::shared_future<void> gpu_released = release_gpu.get_future().share();
  std::atomic<int> gpu_running{0}, gpu_max{0};
  auto work = [&](const JobSpec& spec, Progress& p) -> absl::StatusOr<JobOutcome> {
    p.Begin("work", 1);
    p.End();
    if (spec.device == "cuda") {
      const int now = ++gpu_running;
      gpu_max = std::max(gpu_max.load(), now);
      while (gpu_released.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
        if (p.Cancelled()) {
          --gpu_running;
          return absl::CancelledError("stopped");
        }
      }
      --gpu_running;
    }
    return JobOutcome{"pass", 1};
  };
  auto m = JobManager::Create(work, table_.get(), lookup_.get(), absl::OkStatus(), 1, 8);
  ASSERT_TRUE(m.ok()) << m.status();
  auto& jobs = **m;
  JobSpec gpu{"root", "", "", {}, "", "all", "cuda", "vllm-w13-collapse"};
  const std::string g1 = *jobs.Submit(gpu), g2 = *jobs.Submit(gpu);
  jobs.Watch(g1, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();
  const std::string cpu = *jobs.Submit({"root", "", ""});
  WaitDone(jobs, cpu);  // a CPU job finishes while the GPU job holds the GPU worker
  EXPECT_EQ(jobs.Get(cpu)->state, JobState::kSucceeded);
  EXPECT_EQ(jobs.Get(g2)->state, JobState::kQueued);
  const storage::JobRow row = Stored(g2);
  EXPECT_EQ(row.forward_layers, "all");
  EXPECT_EQ(row.device, "cuda");
  EXPECT_EQ(row.emulate, "vllm-w13-collapse");
  release_gpu.set_value();
  WaitDone(jobs, g2);
  EXPECT_EQ(jobs.Get(g2)->state, JobState::kSucceeded);
  EXPECT_EQ(jobs.Get(g2)->spec.device, "cuda");
  EXPECT_EQ(gpu_max.load(), 1);
}

TEST_F(JobManagerTest, DrainRefusesNewJobs) {
  GatedWork work;
  work.release.set_value();
  auto jobs = Manager(work);
  EXPECT_TRUE(jobs->Drain(absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(jobs->Submit({"root", "", ""}).status().code(), absl::StatusCode::kUnavailable);
}

// A cancel that races the signing (a Slurm job's merge ends, say): either the cancel is accepted
// and the work's Commit refuses, so nothing is signed, or the work committed first and the
// cancel is refused; never an accepted cancel of a job that then signs.
TEST_F(JobManagerTest, CancelAndCommitExcludeEachOther) {
  std::promise<void> committed, cancelled;
  std::shared_future<void> go_on = cancelled.get_future().share();
  std::vector<bool> commits;
  auto m = JobManager::Create(
      [&](const JobSpec& s, JobRun& run) -> absl::StatusOr<JobOutcome> {
        if (s.root == "late") {
          commits.push_back(run.Commit());
          committed.set_value();
          go_on.wait();
          return JobOutcome{"pass", 1};
        }
        while (!run.Cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        commits.push_back(run.Commit());
        if (!commits.back()) return absl::CancelledError("nothing was signed");
        return JobOutcome{"pass", 2};
      },
      table_.get(), lookup_.get(), absl::OkStatus(), 1, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  JobManager& jobs = **m;
  auto late = jobs.Submit({"late", "", ""});
  ASSERT_TRUE(late.ok());
  committed.get_future().wait();
  auto refused = jobs.Cancel(*late);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("too late to cancel"));
  cancelled.set_value();
  WaitDone(jobs, *late);
  EXPECT_EQ(jobs.Get(*late)->state, JobState::kSucceeded);

  auto early = jobs.Submit({"early", "", ""});
  ASSERT_TRUE(early.ok());
  for (int i = 0; i < 400 && jobs.Get(*early)->state != JobState::kRunning; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(jobs.Cancel(*early).ok());
  WaitDone(jobs, *early);
  EXPECT_EQ(jobs.Get(*early)->state, JobState::kCancelled);
  EXPECT_EQ(commits, (std::vector<bool>{true, false}));
}

}  // namespace
}  // namespace ckpt::daemon
