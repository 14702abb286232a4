// ckpt-auditd with oci:// subjects (docs/daemon.md, "OCI subjects"): the registry allow-list
// (--allow-registry) checked before any request reaches a registry, a pair audited from Debian's
// docker-registry like the same files on disk, and --attach: referrers that `verify-oci`
// accepts and the job names (also after a restart), and a registry that refuses pushes failing
// the attach while the record stays.
#include <set>
#include <utility>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "tests/daemon/daemon_process.h"
#include "tests/oci/oci_harness.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::DaemonProcess;
using ::ckpt::testing::FakeRegistry;
using ::ckpt::testing::FakeSetup;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::PairInRegistry;
using ::ckpt::testing::PushPairToDockerRegistry;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::ServeFixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

// A key, and a daemon on loopback without tokens whose Docker config directory (holding no
// config.json: no credentials) is `dir`; `extra` are its registry flags.
class OciDaemon {
 public:
  explicit OciDaemon(const TempDir& dir) : dir_(dir) {
    setenv("DOCKER_CONFIG", dir_.path().c_str(), 1);  // the daemon inherits it
    key_ok_ = RunCli("keys generate --out " + (dir_ / "key.pem").string() + " --trust " +
                         (dir_ / "trusted").string(),
                     dir_.path(), Env())
                  .rc == 0;
  }
  bool Start(const std::vector<std::string>& extra, const std::string& log = "daemon.log") {
    std::vector<std::string> args = {"--listen", "127.0.0.1:0", "--insecure-no-auth",
                                     "--db", (dir_ / "ev.db").string(),
                                     "--key", (dir_ / "key.pem").string(),
                                     "--allow-root", dir_.path().string()};
    args.insert(args.end(), extra.begin(), extra.end());
    if (!key_ok_ || !daemon_.Start(args, dir_ / log)) return false;
    stub_ = pb::AuditService::NewStub(
        grpc::CreateChannel(daemon_.address(), grpc::InsecureChannelCredentials()));
    return true;
  }
  // Closes the channel first: the daemon's stop waits for open connections up to its drain time.
  int Stop() {
    stub_.reset();
    return daemon_.Stop();
  }
  DaemonProcess& process() { return daemon_; }
  pb::AuditService::Stub& stub() { return *stub_; }
  std::string Env() const {
    return "DOCKER_CONFIG='" + dir_.path().string() + "' XDG_DATA_HOME='" +
           (dir_ / "xdg").string() + "'";
  }
  std::string Trust() const { return (dir_ / "trusted").string(); }
  std::string Db() const { return (dir_ / "ev.db").string(); }

  grpc::Status StartAudit(const std::string& root, const std::string& source, pb::Job* job) {
    pb::StartAuditRequest req;
    req.set_root(root);
    req.set_source_root(source);
    grpc::ClientContext ctx;
    return stub_->StartAudit(&ctx, req, job);
  }
  // Polls GetJob until the job is finished (at most 60 s).
  pb::Job Finished(const std::string& id) {
    pb::Job job;
    for (int i = 0; i < 1200; ++i) {
      pb::GetJobRequest req;
      req.set_id(id);
      grpc::ClientContext ctx;
      job.Clear();
      EXPECT_TRUE(stub_->GetJob(&ctx, req, &job).ok());
      if (job.state() != pb::JOB_STATE_QUEUED && job.state() != pb::JOB_STATE_RUNNING) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return job;
  }
  // The statement of log entry `id`, as the daemon serves it.
  nlohmann::json Statement(int64_t id) {
    pb::GetRecordRequest req;
    req.set_id(id);
    pb::Record record;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->GetRecord(&ctx, req, &record).ok());
    auto env = evidence::ParseEnvelope(record.envelope());
    EXPECT_TRUE(env.ok()) << env.status();
    return env.ok() ? nlohmann::json::parse(env->payload) : nlohmann::json();
  }

 private:
  const TempDir& dir_;
  bool key_ok_ = false;
  DaemonProcess daemon_;
  std::unique_ptr<pb::AuditService::Stub> stub_;
};

// name -> sha256 of a statement's subjects.
std::map<std::string, std::string> Subjects(const nlohmann::json& statement) {
  std::map<std::string, std::string> out;
  for (const auto& s : statement["subject"]) {
    out[s["name"].get<std::string>()] = s["digest"]["sha256"].get<std::string>();
  }
  return out;
}

TEST(DaemonOci, RegistryNotOnTheListIsRefusedBeforeAnyRequest) {
  FakeSetup s;
  const std::string digest = ServeFixture(s, "mini-kimi-nvfp4", "");
  auto fake = s.Start();
  ASSERT_TRUE(fake->ready());
  const std::string model = "oci://" + fake->host() + "/m@" + digest;
  const std::string port = fake->host().substr(fake->host().find(':'));
  TempDir dir;
  OciDaemon d(dir);
  // The same host on another port, and the host without its port: exact host[:port] matches.
  ASSERT_TRUE(d.Start({"--allow-registry", "127.0.0.1", "--allow-registry",
                       "LOCALHOST" + port}))
      << d.process().log();
  pb::Job job;
  grpc::Status root = d.StartAudit(model, "", &job);
  EXPECT_EQ(root.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(root.error_message(), HasSubstr("root: registry " + fake->host() + " is not on"));
  const fs::path tree = CopyFixture("mini-kimi-nvfp4", dir);  // inside --allow-root
  grpc::Status source = d.StartAudit(tree.string(), model, &job);
  EXPECT_EQ(source.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(source.error_message(), HasSubstr("source_root: registry " + fake->host()));
  grpc::Status bad = d.StartAudit("oci://" + fake->host() + "/M:v1", "", &job);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("root: 'oci://"));
  EXPECT_EQ(d.Stop(), 0);

  // Without --allow-registry, oci:// is refused altogether.
  ASSERT_TRUE(d.Start({}, "daemon2.log")) << d.process().log();
  grpc::Status none = d.StartAudit(model, "", &job);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(none.error_message(), HasSubstr("none: no --allow-registry"));
  // The registry heard nothing from the daemon.
  EXPECT_TRUE(s.Log().empty()) << "the registry was asked:\n" << s.Log().substr(0, 400);
  EXPECT_EQ(d.Stop(), 0);

  // A registry that is not host[:port] stops the daemon at start.
  DaemonProcess refused;
  EXPECT_FALSE(refused.Start({"--listen", "127.0.0.1:0", "--insecure-no-auth", "--db",
                              (dir / "ev.db").string(), "--key", (dir / "key.pem").string(),
                              "--allow-root", dir.path().string(), "--allow-registry",
                              "registry.example/path"},
                             dir / "refused.log"));
  EXPECT_THAT(refused.log(), HasSubstr("--allow-registry: 'registry.example/path' is not a "
                                       "registry"));
}

TEST(DaemonOci, PairFromARegistryAuditsLikeTheFilesOnDiskAndAttaches) {
  CKPT_SKIP_WITHOUT_DOCKER_REGISTRY();
  TempDir dir;
  PairInRegistry pair;
  ASSERT_NO_FATAL_FAILURE(PushPairToDockerRegistry(dir, &pair));
  const std::string &nv = pair.nv, &mx = pair.mx;
  OciDaemon d(dir);
  ASSERT_TRUE(d.Start({"--allow-registry", pair.host(), "--attach"})) << d.process().log();

  // The source by tag: resolved, and recorded by digest.
  const std::string model = "oci://" + pair.host() + "/m@" + nv;
  pb::Job started;
  grpc::Status s = d.StartAudit(model, "oci://" + pair.host() + "/m:mxfp4", &started);
  ASSERT_TRUE(s.ok()) << s.error_message();
  pb::Job job = d.Finished(started.id());
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.error_code(), 0) << job.error_message();
  EXPECT_EQ(job.model_ref(), model);
  EXPECT_EQ(job.source_ref(), "oci://" + pair.host() + "/m@" + mx);

  // The same verdict and file digests as the same files audited on disk.
  audit::AuditOptions disk;
  disk.root = Fixture("mini-kimi-nvfp4").string();
  disk.source = Fixture("mini-kimi-mxfp4").string();
  auto local = audit::RunAudit(disk, NoProgress());
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(job.verdict(), evidence::VerdictName(local->OverallVerdict()));
  EXPECT_EQ(job.verdict(), "pass");
  std::map<std::string, std::string> expected;
  for (const evidence::Subject& sub : local->subjects) expected[sub.name] = sub.sha256;
  expected[evidence::kOciManifestSubject] = nv.substr(7);
  nlohmann::json statement = d.Statement(job.record_id());
  EXPECT_EQ(Subjects(statement), expected);
  EXPECT_EQ(statement["predicate"]["root"], model);

  // --attach left the record's summary and test result as referrers that verify-oci accepts.
  testing::CliResult verified =
      RunCli("verify-oci --json " + model + " --trust " + d.Trust(), dir.path(), d.Env());
  EXPECT_EQ(verified.rc, 0) << verified.err << verified.out;
  EXPECT_THAT(verified.out, HasSubstr("\"listed_by\": \"referrers-tag\""));
  EXPECT_THAT(verified.out, HasSubstr("https://in-toto.io/attestation/test-result/v0.1"));
  EXPECT_THAT(verified.out, HasSubstr("\"verdict\": \"pass\""));

  // The job names the referrers it pushed, those the registry lists, and still after a restart.
  std::set<std::pair<std::string, std::string>> listed, named;
  const nlohmann::json report = nlohmann::json::parse(verified.out);
  for (const auto& r : report.at("referrers")) {
    listed.insert({r.at("digest").get<std::string>(), r.at("predicate_type").get<std::string>()});
  }
  ASSERT_EQ(job.referrers_size(), 2);
  for (const pb::Referrer& r : job.referrers()) {
    named.insert({r.digest(), r.predicate_type()});
    EXPECT_FALSE(r.referrers_api());  // docker-registry lists them through the tag index
  }
  EXPECT_EQ(named, listed);
  EXPECT_EQ(job.referrers(0).predicate_type(), evidence::kVerificationSummaryType);
  EXPECT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start({"--allow-registry", pair.host()}, "daemon2.log")) << d.process().log();
  pb::Job after = d.Finished(started.id());
  ASSERT_EQ(after.referrers_size(), 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(after.referrers(i).digest(), job.referrers(i).digest());
}

TEST(DaemonOci, AttachToARegistryThatRefusesPushesKeepsTheRecord) {
  FakeSetup s;  // not writable: uploads answer 405
  const std::string digest = ServeFixture(s, "mini-kimi-nvfp4", "");
  auto fake = s.Start();
  ASSERT_TRUE(fake->ready());
  const std::string model = "oci://" + fake->host() + "/m@" + digest;
  TempDir dir;
  OciDaemon d(dir);
  ASSERT_TRUE(d.Start({"--allow-registry", fake->host(), "--attach", "--metrics-listen",
                       "127.0.0.1:0"}))
      << d.process().log();
  pb::Job started;
  grpc::Status st = d.StartAudit(model, "", &started);
  ASSERT_TRUE(st.ok()) << st.error_message();
  pb::Job job = d.Finished(started.id());
  // The audit succeeded and its record is in the log; the job says why nothing was attached.
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  ASSERT_GE(job.record_id(), 0);
  EXPECT_NE(job.error_code(), 0);
  EXPECT_THAT(job.error_message(), HasSubstr("attach of record " +
                                             std::to_string(job.record_id()) + " to " + model +
                                             " failed (the record stays in the log)"));
  EXPECT_THAT(job.error_message(), HasSubstr("405"));
  EXPECT_THAT(s.Log(), HasSubstr("registry POST /v2/m/blobs/uploads/"));
  EXPECT_EQ(Subjects(d.Statement(job.record_id()))[evidence::kOciManifestSubject],
            digest.substr(7));
  EXPECT_THAT(d.process().log(), HasSubstr("\"msg\":\"attach failed\""));
  EXPECT_THAT(testing::ScrapeMetrics(d.process().metrics_port()),
              HasSubstr("ckpt_auditd_attaches_total{result=\"error\"} 1"));
  EXPECT_EQ(d.Stop(), 0);

  // The record verifies in the log, and the job keeps the attach error after a restart.
  testing::CliResult log = RunCli("verify-log --db " + d.Db() + " --trust " + d.Trust(),
                                  dir.path(), d.Env());
  EXPECT_EQ(log.rc, 0) << log.err << log.out;
  ASSERT_TRUE(d.Start({"--allow-registry", fake->host()}, "daemon2.log")) << d.process().log();
  pb::Job after = d.Finished(started.id());
  EXPECT_EQ(after.state(), pb::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(after.record_id(), job.record_id());
  EXPECT_EQ(after.error_message(), job.error_message());
}

}  // namespace
}  // namespace ckpt
