// ckpt-auditd --executor slurm against a real single-host Slurm cluster (deploy/slurm/cluster.sh;
// run through daemon_slurm_test.sh, which starts the cluster and exports SLURM_CONF): StartAudit
// as a 3-part array followed to the end over WatchJob, the record equal to what `audit --merge`
// of the same parts appends; CancelJob scancels the array and signs nothing; a restarted daemon
// follows the array it submitted before; a failing part fails the job naming the part and its
// Slurm state; slurmctld unreachable is UNAVAILABLE (docs/daemon.md "Slurm executor").
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/evidence/dsse.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/evidence_log.h"
#include "tests/daemon/daemon_process.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::DaemonProcess;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// A shell command's standard output (its exit status in *rc when given).
std::string Shell(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  int status = ::pclose(p);
  if (rc != nullptr) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The states scontrol gives the tasks of array job `id`: "0 CANCELLED, 1 CANCELLED, ...".
std::string TaskStates(const std::string& id) {
  return Shell("scontrol show job -o " + id +
               " | tr ' ' '\\n' | sed -n 's/^JobState=//p' | sort | uniq -c | tr -s ' '");
}

// The statement of entry `seq` of the log at `db`.
nlohmann::json Statement(const fs::path& db, uint64_t seq) {
  auto log = storage::EvidenceLog::OpenReadOnly(db.string(), "test log");
  EXPECT_TRUE(log.ok()) << log.status();
  if (!log.ok()) return {};
  auto entry = (*log)->Get(seq);
  EXPECT_TRUE(entry.ok()) << entry.status();
  if (!entry.ok()) return {};
  auto envelope = evidence::ParseEnvelope(entry->envelope);
  EXPECT_TRUE(envelope.ok()) << envelope.status();
  return envelope.ok() ? nlohmann::json::parse(envelope->payload) : nlohmann::json{};
}

uint64_t LogSize(const fs::path& db) {
  auto log = storage::EvidenceLog::OpenReadOnly(db.string(), "test log");
  if (!log.ok()) return 0;
  auto size = (*log)->Size();
  return size.ok() ? *size : 0;
}

class DaemonSlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("SLURM_CONF"), nullptr)
        << "runs on the private cluster that tests/deploy/daemon_slurm_test.sh starts";
    // The nodes (this host) read the trees and write parts where the daemon says.
    ::chmod(dir_.path().c_str(), 0755);
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    fs::create_directories(parts_);
    for (const std::string& args :
         {"keys generate --out " + (dir_ / "key.pem").string() + " --trust " +
              (dir_ / "trust").string(),
          "keys generate --name slurm-node --out " + (dir_ / "node.pem").string() + " --trust " +
              (dir_ / "part-trust").string()}) {
      CliResult r = RunCli(args, dir_.path());
      ASSERT_EQ(r.rc, 0) << r.err;
    }
  }

  std::vector<std::string> DaemonArgs(
      const std::vector<std::string>& extra = {},
      const std::string& cli = std::string(::ckpt::testing::kBinaryDir) + "/services/cli/ckpt-audit") {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--insecure-no-auth", "--db", db_.string(), "--key",
        (dir_ / "key.pem").string(), "--allow-root", dir_.path().string(), "--executor", "slurm",
        "--slurm-parts-dir", parts_.string(), "--slurm-node-key", (dir_ / "node.pem").string(),
        "--part-trust", (dir_ / "part-trust").string(), "--slurm-audit-binary", cli,
        "--slurm-poll-ms", "200",
        "--drain-seconds", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::unique_ptr<pb::AuditService::Stub> Stub(const DaemonProcess& d) {
    return pb::AuditService::NewStub(
        grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  }
  static std::unique_ptr<grpc::ClientContext> Ctx(int seconds = 120) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return ctx;
  }

  pb::Job Start(pb::AuditService::Stub& stub, const fs::path& root, unsigned parts) {
    pb::StartAuditRequest req;
    req.set_root(root.string());
    req.set_source_root(src_.string());
    req.set_parts(parts);
    pb::Job job;
    grpc::Status s = stub.StartAudit(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // Every event of the job until the first for which `stop` is true (or the last one).
  std::vector<pb::JobEvent> Watch(pb::AuditService::Stub& stub, const std::string& id,
                                  const std::function<bool(const pb::JobEvent&)>& stop =
                                      [](const pb::JobEvent&) { return false; }) {
    pb::WatchJobRequest req;
    req.set_id(id);
    auto ctx = Ctx();
    auto reader = stub.WatchJob(ctx.get(), req);
    std::vector<pb::JobEvent> events;
    pb::JobEvent e;
    while (reader->Read(&e)) {
      events.push_back(e);
      if (stop(e)) {
        ctx->TryCancel();
        break;
      }
    }
    reader->Finish();
    return events;
  }

  // Follows the job to its first "parts" event: the array job id then stored with the job.
  std::string WaitForArray(pb::AuditService::Stub& stub, const std::string& id) {
    std::vector<pb::JobEvent> seen =
        Watch(stub, id, [](const pb::JobEvent& e) { return e.phase() == "parts"; });
    if (seen.empty() || seen.back().phase() != "parts") {
      ADD_FAILURE() << id << ": no parts event";
      return "";
    }
    pb::GetJobRequest get;
    get.set_id(id);
    pb::Job now;
    EXPECT_TRUE(stub.GetJob(Ctx().get(), get, &now).ok());
    EXPECT_THAT(now.executor_job(), ContainsRegex("^[0-9]+$"));
    return now.executor_job();
  }

  // Releases the held `array` and follows job `id` to its end: the job as it ended.
  pb::Job ReleaseAndFinish(pb::AuditService::Stub& stub, const std::string& array,
                           const std::string& id) {
    int rc = -1;
    Shell("scontrol release " + array, &rc);
    EXPECT_EQ(rc, 0);
    std::vector<pb::JobEvent> events = Watch(stub, id);
    EXPECT_TRUE(!events.empty() && events.back().done());
    return events.empty() ? pb::Job() : events.back().job();
  }

  TempDir dir_;
  fs::path src_, dst_;
  fs::path db_ = dir_ / "ev.db", parts_ = dir_ / "parts";
};

TEST_F(DaemonSlurmTest, ThreePartsMergedAndSignedAsAuditMergeWould) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs(), dir_ / "daemon.log")) << d.log();
  auto stub = Stub(d);
  pb::Job job = Start(*stub, dst_, 3);
  EXPECT_EQ(job.parts(), 3u);
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_FALSE(events.empty());
  const pb::JobEvent& last = events.back();
  ASSERT_TRUE(last.done());
  ASSERT_EQ(last.job().state(), pb::JOB_STATE_SUCCEEDED)
      << last.job().error_message() << "\n" << d.log();
  EXPECT_EQ(last.job().verdict(), "pass");
  const std::string array = last.job().executor_job();
  ASSERT_THAT(array, ContainsRegex("^[0-9]+$"));

  // Per-part progress: the array's id, then each part's state until all three completed.
  bool announced = false;
  uint64_t most_done = 0;
  std::string final_states;
  for (const pb::JobEvent& e : events) {
    if (e.phase() == "slurm") {
      announced = e.message().find("array job " + array) != std::string::npos;
    }
    if (e.phase() != "parts") continue;
    EXPECT_EQ(e.total_units(), 3u);
    EXPECT_GE(e.done_units(), most_done) << "parts completed went down";
    most_done = e.done_units();
    final_states = e.message();
  }
  EXPECT_TRUE(announced);
  EXPECT_EQ(most_done, 3u);
  EXPECT_EQ(final_states,
            "Slurm array job " + array + ": 0 COMPLETED, 1 COMPLETED, 2 COMPLETED");

  // The record equals what `audit --merge` of the same part files appends, but for the merge's
  // own finishing time.
  const fs::path dir = parts_ / job.id();
  std::string files;
  for (int i = 0; i < 3; ++i) {
    files += " " + (dir / ("part-" + std::to_string(i) + ".json")).string();
  }
  CliResult merged = RunCli("audit --merge" + files + " --part-trust " +
                                (dir_ / "part-trust").string() + " --db " +
                                (dir_ / "cli.db").string() + " --key " +
                                (dir_ / "key.pem").string() + " --json",
                            dir_.path());
  ASSERT_EQ(merged.rc, 0) << merged.err;
  nlohmann::json daemon_record = Statement(db_, last.job().record_id());
  nlohmann::json cli_record = Statement(dir_ / "cli.db", 0);
  ASSERT_TRUE(daemon_record.contains("predicate"));
  EXPECT_EQ(daemon_record["predicate"]["parts"].size(), 3u);
  EXPECT_EQ(daemon_record["predicate"].value("invoker", ""), "admin:anonymous");
  for (nlohmann::json* r : {&daemon_record, &cli_record}) (*r)["predicate"].erase("finished_at");
  EXPECT_EQ(daemon_record, cli_record);

  // What cannot run as parts is refused before anything is queued.
  const uint64_t size = LogSize(db_);
  pb::StartAuditRequest bad;
  bad.set_root(dst_.string());
  bad.set_source_root(src_.string());
  bad.set_parts(65);  // above --slurm-max-parts (64)
  pb::Job refused;
  EXPECT_EQ(stub->StartAudit(Ctx().get(), bad, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_parts(2);
  bad.set_forward_layers("all");  // the block forward is not split
  EXPECT_EQ(stub->StartAudit(Ctx().get(), bad, &refused).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(LogSize(db_), size);
  EXPECT_EQ(d.Stop(), 0);
}

// Without `parts`, one part per --slurm-part-bytes of both trees' files, at least one.
TEST_F(DaemonSlurmTest, DefaultPartsFollowTheTreesSize) {
  uint64_t bytes = 0;
  for (const fs::path& tree : {dst_, src_}) {
    for (const auto& e : fs::recursive_directory_iterator(tree)) {
      if (e.is_regular_file()) bytes += e.file_size();
    }
  }
  const uint64_t per_part = bytes / 3 + 1;  // three parts' worth
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold", "--slurm-part-bytes",
                                  std::to_string(per_part)}),
                      dir_ / "daemon.log"))
      << d.log();
  auto stub = Stub(d);
  pb::Job job = Start(*stub, dst_, 0);
  EXPECT_EQ(job.parts(), 3u);
  pb::CancelJobRequest cancel;
  cancel.set_id(job.id());
  pb::Job answer;
  EXPECT_TRUE(stub->CancelJob(Ctx().get(), cancel, &answer).ok());
  EXPECT_EQ(Watch(*stub, job.id()).back().job().state(), pb::JOB_STATE_CANCELLED);
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(DaemonSlurmTest, CancelJobScancelsTheArrayAndSignsNothing) {
  DaemonProcess d;
  // Held: the parts wait until released, so the cancel finds them pending.
  ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold"}), dir_ / "daemon.log")) << d.log();
  auto stub = Stub(d);
  pb::Job job = Start(*stub, dst_, 3);
  const std::string array = WaitForArray(*stub, job.id());
  ASSERT_FALSE(array.empty()) << d.log();
  const uint64_t before = LogSize(db_);

  pb::CancelJobRequest cancel;
  cancel.set_id(job.id());
  pb::Job answer;
  ASSERT_TRUE(stub->CancelJob(Ctx().get(), cancel, &answer).ok());
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_TRUE(events.back().done());
  EXPECT_EQ(events.back().job().state(), pb::JOB_STATE_CANCELLED);
  EXPECT_THAT(events.back().job().error_message(),
              HasSubstr("Slurm array job " + array + " scancelled; nothing was signed"));
  EXPECT_THAT(TaskStates(array), HasSubstr("CANCELLED"));
  EXPECT_THAT(TaskStates(array), ::testing::Not(HasSubstr("PENDING")));
  EXPECT_EQ(LogSize(db_), before);
  EXPECT_FALSE(fs::exists(parts_ / job.id() / "part-0.json"));
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(DaemonSlurmTest, RestartedDaemonFollowsTheArrayItSubmitted) {
  std::string array;
  pb::Job job;
  {
    DaemonProcess d;
    ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold"}), dir_ / "daemon1.log"))
        << d.log();
    auto stub = Stub(d);
    job = Start(*stub, dst_, 2);
    array = WaitForArray(*stub, job.id());
    ASSERT_FALSE(array.empty()) << d.log();
    EXPECT_EQ(d.Stop(), 0);  // the array stays: the job runs again at the next start
  }
  EXPECT_THAT(TaskStates(array), HasSubstr("PENDING"));
  int rc = -1;
  Shell("scontrol release " + array, &rc);
  ASSERT_EQ(rc, 0);
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs(), dir_ / "daemon2.log")) << d.log();
  auto stub = Stub(d);
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_TRUE(events.back().done());
  ASSERT_EQ(events.back().job().state(), pb::JOB_STATE_SUCCEEDED)
      << events.back().job().error_message() << "\n" << d.log();
  EXPECT_EQ(events.back().job().executor_job(), array);
  EXPECT_EQ(events.back().job().verdict(), "pass");
  // No second array was submitted for the job.
  EXPECT_EQ(Shell("scontrol show job -o | grep -c 'JobName=ckpt-auditd-" + job.id() +
                  "' | tr -d '\\n'"),
            Shell("scontrol show job -o " + array + " | wc -l | tr -d ' \\n'"));
  EXPECT_EQ(d.Stop(), 0);
}

// The array id is state, not part of the authenticated request: whoever writes the database can
// change it. A restarted daemon then follows a job that is no array of the job's parts (here a
// held plain job), and fails the job instead of waiting for it forever or submitting another.
TEST_F(DaemonSlurmTest, AnArrayIdChangedInTheDatabaseEndsTheJob) {
  pb::Job job;
  {
    DaemonProcess d;
    ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold"}), dir_ / "daemon1.log"))
        << d.log();
    auto stub = Stub(d);
    job = Start(*stub, dst_, 2);
    ASSERT_FALSE(WaitForArray(*stub, job.id()).empty()) << d.log();
    EXPECT_EQ(d.Stop(), 0);
  }
  int rc = -1;
  std::string plain = Shell("sbatch --parsable --hold --wrap true", &rc);
  ASSERT_EQ(rc, 0);
  plain = plain.substr(0, plain.find_first_of(";\n"));
  {
    ::ckpt::testing::RawDb raw(db_.string());
    ASSERT_EQ(raw.Exec("UPDATE jobs SET executor_job = '" + plain + "' WHERE id = '" + job.id() +
                       "'"),
              0)
        << raw.error();
  }
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs(), dir_ / "daemon2.log")) << d.log();
  auto stub = Stub(d);
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_TRUE(events.back().done());
  const pb::Job& end = events.back().job();
  EXPECT_EQ(end.state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(end.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(end.error_message(),
              HasSubstr("Slurm array job " + plain + " is unknown to slurmctld (no task of array "
                        "job " + plain + " in its answer)"));
  EXPECT_THAT(end.error_message(), HasSubstr("parts 0, 1 left no part file"));
  EXPECT_EQ(LogSize(db_), 0u);
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(DaemonSlurmTest, FailedPartFailsTheJobNamingPartAndState) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold"}), dir_ / "daemon.log")) << d.log();
  auto stub = Stub(d);
  // A root that is gone when the parts run. Its name is no shell syntax in the parts' script.
  fs::path doomed = dir_ / "doomed 'x' $(touch pwned)";
  fs::copy(dst_, doomed, fs::copy_options::recursive);
  pb::Job job = Start(*stub, doomed, 3);
  const std::string array = WaitForArray(*stub, job.id());
  ASSERT_FALSE(array.empty()) << d.log();
  const uint64_t before = LogSize(db_);
  fs::remove_all(doomed);
  const pb::Job end = ReleaseAndFinish(*stub, array, job.id());
  EXPECT_EQ(end.state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(end.error_code(), static_cast<int>(grpc::StatusCode::ABORTED));
  EXPECT_THAT(end.error_message(),
              ContainsRegex("part [0-2] of 3 \\(Slurm job " + array +
                            "_[0-2]\\) ended FAILED \\(exit code 2:0\\): .*doomed"));
  EXPECT_THAT(end.error_message(), HasSubstr("nothing was signed"));
  EXPECT_THAT(end.error_message(), HasSubstr(doomed.string()));
  EXPECT_FALSE(fs::exists(parts_ / job.id() / "pwned"));
  EXPECT_EQ(LogSize(db_), before);
  EXPECT_EQ(d.Stop(), 0);
}

// The root replaced, while the array is held, by a link to a tree outside --allow-root: the
// parts read that tree through the checked path, and the merge, which reads through the
// directory StartAudit opened and checked, refuses them; nothing is signed (docs/audit-parts.md,
// "What a part trusts").
TEST_F(DaemonSlurmTest, ARootSwappedForALinkWhileThePartsWaitIsRefused) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs({"--slurm-sbatch-arg=--hold"}), dir_ / "daemon.log")) << d.log();
  auto stub = Stub(d);
  const fs::path root = dir_ / "swapped";
  fs::copy(dst_, root, fs::copy_options::recursive);
  TempDir outside;
  const fs::path foreign = outside / "foreign";
  fs::copy(dst_, foreign, fs::copy_options::recursive);
  pb::Job job = Start(*stub, root, 2);
  const std::string array = WaitForArray(*stub, job.id());
  ASSERT_FALSE(array.empty()) << d.log();
  fs::rename(root, dir_ / "moved-away");
  fs::create_directory_symlink(foreign, root);
  const pb::Job end = ReleaseAndFinish(*stub, array, job.id());
  EXPECT_EQ(end.state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(end.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION))
      << end.error_message();
  EXPECT_THAT(end.error_message(),
              HasSubstr("read the root at " + fs::canonical(foreign).string()));
  EXPECT_THAT(end.error_message(), HasSubstr("not the tree the audit was started on"));
  EXPECT_EQ(LogSize(db_), 0u);
  EXPECT_EQ(d.Stop(), 0);
}

// A node with a trusted key that audits another tree than the job asked for (here a wrapper in
// place of ckpt-audit that swaps the root for an identical copy): its parts are signed and
// merge, but the daemon refuses them and signs nothing.
TEST_F(DaemonSlurmTest, PartsOfAnotherAuditAreRefused) {
  const fs::path other = dir_ / "other";
  fs::copy(dst_, other, fs::copy_options::recursive);
  const fs::path wrapper = dir_ / "swapping-ckpt-audit";
  ::ckpt::testing::WriteAll(wrapper, "#!/bin/sh\ncmd=$1\nshift 2\nexec '" +
                                         std::string(::ckpt::testing::kBinaryDir) +
                                         "/services/cli/ckpt-audit' \"$cmd\" '" +
                                         other.string() + "' \"$@\"\n");
  ::chmod(wrapper.c_str(), 0755);
  DaemonProcess d;
  ASSERT_TRUE(d.Start(DaemonArgs({}, wrapper.string()),
                      dir_ / "daemon.log"))
      << d.log();
  auto stub = Stub(d);
  pb::Job job = Start(*stub, dst_, 2);
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_TRUE(events.back().done());
  const pb::Job& end = events.back().job();
  EXPECT_EQ(end.state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(end.error_code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_THAT(end.error_message(), HasSubstr("the part ran another audit than job " + job.id()));
  EXPECT_THAT(end.error_message(), HasSubstr("root '" + other.string() + "'"));
  EXPECT_TRUE(fs::exists(parts_ / job.id() / "part-0.json"));
  EXPECT_EQ(LogSize(db_), 0u);
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(DaemonSlurmTest, UnreachableControllerIsUnavailable) {
  // A configuration whose slurmctld port nobody listens on.
  std::ifstream in(std::getenv("SLURM_CONF"));
  std::string conf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  conf = std::regex_replace(conf, std::regex("SlurmctldPort=[0-9]+"), "SlurmctldPort=9");
  conf += "MessageTimeout=2\n";
  ::ckpt::testing::WriteAll(dir_ / "unreachable.conf", conf);
  const std::string saved = std::getenv("SLURM_CONF");
  ::setenv("SLURM_CONF", (dir_ / "unreachable.conf").c_str(), 1);
  DaemonProcess d;
  const bool started = d.Start(DaemonArgs(), dir_ / "daemon.log");
  ::setenv("SLURM_CONF", saved.c_str(), 1);
  ASSERT_TRUE(started) << d.log();
  auto stub = Stub(d);
  pb::Job job = Start(*stub, dst_, 2);
  std::vector<pb::JobEvent> events = Watch(*stub, job.id());
  ASSERT_TRUE(events.back().done());
  EXPECT_EQ(events.back().job().state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(events.back().job().error_code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE))
      << events.back().job().error_message();
  EXPECT_EQ(LogSize(db_), 0u);
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace ckpt
