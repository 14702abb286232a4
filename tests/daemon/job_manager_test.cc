#include "services/daemon/job_manager.h"

#include <atomic>
#include <future>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

// A job that reports 4 progress steps, then blocks until released.
struct GatedWork {
  std::promise<void> release;
  std::shared_future<void> released{release.get_future().share()};
  absl::StatusOr<JobOutcome> operator()(const JobSpec& spec, Progress& p) {
    p.Begin("work", 4);
    for (int i = 0; i < 4; ++i) p.Advance(1);
    p.End();
    released.wait();
    if (spec.root == "bad") return absl::InvalidArgumentError("bad root");
    return JobOutcome{"pass", 7};
  }
};

TEST(JobManager, LateWatcherReplaysHistoryAndSeesOutcome) {
  GatedWork work;
  JobManager jobs([&](const JobSpec& s, Progress& p) { return work(s, p); }, 1, 4);
  auto id = jobs.Submit({"root", "", "scale-window"});
  ASSERT_TRUE(id.ok());
  work.release.set_value();
  std::vector<JobEvent> events;
  ASSERT_TRUE(jobs.Watch(*id, [&](const JobEvent& e) {
    events.push_back(e);
    return true;
  }).ok());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().phase, "queued");
  EXPECT_TRUE(events.back().done);
  EXPECT_THAT(events.back().message, ::testing::HasSubstr("record 7"));
  bool saw_full = false;
  for (const auto& e : events) saw_full |= e.phase == "work" && e.done_units == 4;
  EXPECT_TRUE(saw_full);
  auto snap = jobs.Get(*id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->state, JobState::kSucceeded);
  EXPECT_EQ(snap->outcome.record_id, 7);
  EXPECT_FALSE(snap->finished_at.empty());
}

TEST(JobManager, FailedJobKeepsItsStatus) {
  GatedWork work;
  work.release.set_value();
  JobManager jobs([&](const JobSpec& s, Progress& p) { return work(s, p); }, 1, 4);
  auto id = jobs.Submit({"bad", "", ""});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(jobs.Watch(*id, [](const JobEvent&) { return true; }).ok());
  auto snap = jobs.Get(*id);
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->state, JobState::kFailed);
  EXPECT_EQ(snap->error.code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobManager, QueueIsBounded) {
  GatedWork work;
  {
    JobManager jobs([&](const JobSpec& s, Progress& p) { return work(s, p); }, 1, 2);
    // One job runs (blocked), two wait; the fourth is refused.
    std::vector<std::string> ids;
    for (int i = 0; i < 3; ++i) {
      auto id = jobs.Submit({"root", "", ""});
      ASSERT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
      if (i == 0) {  // make sure the first job left the queue before counting
        jobs.Watch(*id, [](const JobEvent& e) { return e.phase != "work"; }).IgnoreError();
      }
    }
    auto refused = jobs.Submit({"root", "", ""});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(jobs.Get("job-999999").status().code() == absl::StatusCode::kNotFound);
    work.release.set_value();
  }  // destructor joins the workers
}

TEST(JobManager, WatcherCanStopEarly) {
  GatedWork work;
  JobManager jobs([&](const JobSpec& s, Progress& p) { return work(s, p); }, 1, 4);
  auto id = jobs.Submit({"root", "", ""});
  ASSERT_TRUE(id.ok());
  int seen = 0;
  ASSERT_TRUE(jobs.Watch(*id, [&](const JobEvent&) { return ++seen < 2; }).ok());
  EXPECT_EQ(seen, 2);
  work.release.set_value();
}

TEST(JobManager, KeepsOnlyTheNewestFinishedJobs) {
  GatedWork work;
  work.release.set_value();
  JobManager jobs([&](const JobSpec& s, Progress& p) { return work(s, p); }, 1, 8,
                  /*max_retained=*/2);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = jobs.Submit({"root", "", ""});
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(jobs.Watch(*id, [](const JobEvent&) { return true; }).ok());
    ids.push_back(*id);
  }
  EXPECT_EQ(jobs.Get(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.Get(ids[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs.Get(ids[2]).ok());
  EXPECT_TRUE(jobs.Get(ids[3]).ok());
}

}  // namespace
}  // namespace ckpt::daemon
