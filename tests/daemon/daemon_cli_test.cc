// The shipped binaries together: ckpt-auditd on a loopback port with a token file, driven by
// `ckpt-audit submit`, `gate` and `tokens add` and by a gRPC stub, checking the exit codes CI
// relies on; `gate` against fake servers; one writer per log; jobs that survive kill -9.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <sstream>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/evidence/dsse.h"
#include "core/evidence/ed25519.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/job_table.h"
#include "tests/core/deep_tree.h"
#include "tests/daemon/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::DaemonProcess;
using ::ckpt::testing::ReadText;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

class DaemonCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    CliResult key = RunCli("keys generate --out " + (dir_ / "key.pem").string() + " --trust " +
                               trust_.string(),
                           dir_.path());
    ASSERT_EQ(key.rc, 0) << key.err;
    CliResult token = RunCli("tokens add --file " + tokens_.string() +
                                 " --role admin --name ci-admin --out " + token_file_.string(),
                             dir_.path());
    ASSERT_EQ(token.rc, 0) << token.err;
    ASSERT_TRUE(daemon_.Start(DaemonArgs(), dir_ / "daemon.log")) << daemon_.log();
  }
  void TearDown() override { EXPECT_EQ(daemon_.Stop(), 0) << "daemon did not stop cleanly"; }

  // The CLI against the daemon with the admin token (plaintext loopback, as the test daemon
  // listens) and a gate state file of its own.
  CliResult Cli(const std::string& args) {
    return RunCli(args + " --server " + daemon_.address() + " --insecure-loopback --token-file " +
                      token_file_.string(),
                  dir_.path(), StateEnv());
  }
  std::string StateEnv() const { return "XDG_STATE_HOME='" + (dir_ / "state").string() + "'"; }

  // A gRPC stub to the daemon and a context carrying the admin token.
  std::unique_ptr<pb::AuditService::Stub> Stub() {
    return pb::AuditService::NewStub(
        grpc::CreateChannel(daemon_.address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    std::string token = ReadText(token_file_);
    ctx->AddMetadata("authorization", "Bearer " + token.substr(0, token.find('\n')));
    return ctx;
  }
  pb::Job GetJob(pb::AuditService::Stub& stub, const std::string& id) {
    pb::GetJobRequest req;
    req.set_id(id);
    pb::Job job;
    grpc::Status s = stub.GetJob(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
    return job;
  }
  std::string Start(pb::AuditService::Stub& stub, const fs::path& root, const fs::path& source) {
    pb::StartAuditRequest req;
    req.set_root(root.string());
    req.set_source_root(source.string());
    pb::Job job;
    grpc::Status s = stub.StartAudit(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.id();
  }
  // A copy of the fixture with `files` sparse files of 1 GiB each (inside the engine's memory
  // window) that its audit reads: an audit still running when the test kills the daemon.
  fs::path SlowRoot(const std::string& name, int files) {
    fs::path slow = dir_ / name;
    fs::copy(dst_, slow, fs::copy_options::recursive);
    for (int i = 0; i < files; ++i) {
      int fd = ::open((slow / ("blob" + std::to_string(i) + ".bin")).c_str(),
                      O_WRONLY | O_CREAT, 0644);
      EXPECT_GE(fd, 0);
      EXPECT_EQ(::ftruncate(fd, 1ll << 30), 0);
      ::close(fd);
    }
    return slow;
  }
  // Polls (at most 30 s, a loaded machine) until the job runs and its database row says so:
  // the daemon stores the running state just after GetJob shows it.
  void WaitRunning(pb::AuditService::Stub& stub, const std::string& id) {
    auto jobs = storage::JobTable::Open((dir_ / "ev.db").string(), "ev.db", std::nullopt);
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    for (int i = 0; i < 6000; ++i) {
      auto row = (*jobs)->Get(id);
      if (row.ok() && row->state == "running") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(GetJob(stub, id).state(), pb::JOB_STATE_RUNNING) << id;
    auto row = (*jobs)->Get(id);
    ASSERT_TRUE(row.ok()) << row.status();
    ASSERT_EQ(row->state, "running") << id;
  }
  // SIGKILL, as a crash or the OOM killer would stop it, and a start on the same database.
  void KillAndRestart(std::unique_ptr<pb::AuditService::Stub>& stub, const std::string& log) {
    daemon_.Kill();
    stub.reset();
    ASSERT_TRUE(daemon_.Start(DaemonArgs(), dir_ / log)) << daemon_.log();
    stub = Stub();
  }
  // WatchJob to its end: the job its last event carries. The stream must end OK.
  pb::Job WatchToEnd(pb::AuditService::Stub& stub, const std::string& id,
                     std::string* last_message = nullptr) {
    pb::WatchJobRequest watch;
    watch.set_id(id);
    auto ctx = Ctx();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub.WatchJob(ctx.get(), watch);
    pb::JobEvent e, last;
    while (reader->Read(&e)) last = e;
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << id << ": " << s.error_message();
    EXPECT_TRUE(last.done()) << id;
    if (last_message != nullptr) *last_message = last.message();
    return last.job();
  }
  std::vector<std::string> DaemonArgs() {
    return {"--listen", "127.0.0.1:0", "--tokens", tokens_.string(),
            "--db", (dir_ / "ev.db").string(), "--key", (dir_ / "key.pem").string(),
            "--allow-root", dir_.path().string()};
  }

  TempDir dir_;
  fs::path src_, dst_;
  fs::path trust_ = dir_ / "trust.txt", tokens_ = dir_ / "tokens", token_file_ = dir_ / "token";
  DaemonProcess daemon_;
};

TEST_F(DaemonCliTest, SubmitThenGateExitCodes) {
  CliResult gate0 = Cli("gate " + dst_.string() + " --trust " + trust_.string());
  EXPECT_EQ(gate0.rc, 1) << gate0.err;  // nothing audited yet
  EXPECT_THAT(gate0.out, HasSubstr("no audit record"));

  CliResult submit = Cli("submit " + dst_.string() + " --source " + src_.string() + " --json");
  ASSERT_EQ(submit.rc, 0) << submit.err;
  auto j = nlohmann::json::parse(submit.out);
  EXPECT_EQ(j.at("verdict"), "pass");

  CliResult gate = Cli("gate " + dst_.string() + " --json --trust " + trust_.string());
  ASSERT_EQ(gate.rc, 0) << gate.err << gate.out;
  auto g = nlohmann::json::parse(gate.out);
  EXPECT_TRUE(g.at("pass").get<bool>());
  EXPECT_EQ(g.at("record_id"), j.at("record_id"));
  EXPECT_THAT(g.at("verification").get<std::string>(), HasSubstr("verified"));

  // The same PASS is not believed by a client that does not trust the daemon's key.
  TempDir other;
  CliResult other_key = RunCli("keys generate --out " + (other / "k.pem").string() +
                                   " --trust " + (other / "trust.txt").string(),
                               other.path());
  ASSERT_EQ(other_key.rc, 0) << other_key.err;
  CliResult untrusted = Cli("gate " + dst_.string() + " --trust " + (other / "trust.txt").string());
  EXPECT_EQ(untrusted.rc, 1) << untrusted.err;
  EXPECT_THAT(untrusted.out, HasSubstr("does not verify"));
}

// Relative paths are made absolute by the client, against its own working directory, not sent as
// typed for the daemon to resolve against its own.
TEST_F(DaemonCliTest, RelativeRootsAreResolvedByTheClient) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_.path());
  CliResult submit = Cli("submit " + dst_.filename().string() + " --source ./" +
                         src_.filename().string() + "/ --json");
  CliResult gate = Cli("gate " + dst_.filename().string() + " --json --trust " + trust_.string());
  fs::current_path(cwd);
  ASSERT_EQ(submit.rc, 0) << submit.err;
  EXPECT_EQ(nlohmann::json::parse(submit.out).at("verdict"), "pass");
  ASSERT_EQ(gate.rc, 0) << gate.err << gate.out;
  EXPECT_TRUE(nlohmann::json::parse(gate.out).at("pass").get<bool>());
}

TEST_F(DaemonCliTest, ErrorsExitTwo) {
  CliResult outside = Cli("gate / --trust " + trust_.string());
  EXPECT_EQ(outside.rc, 2);
  EXPECT_THAT(outside.err, HasSubstr("PERMISSION_DENIED"));
  CliResult missing = Cli("submit " + (dir_ / "nope").string());
  EXPECT_EQ(missing.rc, 2);
  CliResult unreachable = RunCli("gate " + dst_.string() + " --server 127.0.0.1:1 --trust " +
                                     trust_.string(),
                                 dir_.path(), StateEnv());
  EXPECT_EQ(unreachable.rc, 2);
  EXPECT_THAT(unreachable.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(DaemonCliTest, TokensAddPrintsATokenThatWorksAndStoresOnlyItsHash) {
  CliResult add = RunCli("tokens add --file " + tokens_.string() + " --role reader --name r1",
                         dir_.path());
  ASSERT_EQ(add.rc, 0) << add.err;
  std::string token = add.out.substr(0, add.out.find('\n'));
  EXPECT_THAT(token, ::testing::MatchesRegex("ckpt_[0-9a-f]{64}"));
  std::string file = ReadText(tokens_);
  EXPECT_THAT(file, Not(HasSubstr(token)));
  EXPECT_THAT(file, Not(HasSubstr(token.substr(5))));
  EXPECT_THAT(file, HasSubstr(" reader r1\n"));
  struct stat st;
  ASSERT_EQ(::stat(tokens_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // The same name twice is refused and the file is unchanged.
  CliResult again = RunCli("tokens add --file " + tokens_.string() + " --role admin --name r1",
                           dir_.path());
  EXPECT_EQ(again.rc, 2);
  EXPECT_THAT(again.err, HasSubstr("already exists"));
  EXPECT_EQ(ReadText(tokens_), file);

  // --out: the token goes to a new file of mode 0600, as submit requires, not to stdout; an
  // existing file refuses the add before the daemon's file changes.
  const fs::path out = dir_ / "r2.token";
  CliResult to_file = RunCli("tokens add --file " + tokens_.string() +
                                 " --role reader --name r2 --out " + out.string(),
                             dir_.path());
  ASSERT_EQ(to_file.rc, 0) << to_file.err;
  EXPECT_EQ(to_file.out, "");
  EXPECT_THAT(ReadText(out), ::testing::MatchesRegex("ckpt_[0-9a-f]{64}\n"));
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string with_r2 = ReadText(tokens_);
  EXPECT_THAT(with_r2, HasSubstr(" reader r2\n"));
  CliResult over = RunCli("tokens add --file " + tokens_.string() +
                              " --role reader --name r3 --out " + out.string(),
                          dir_.path());
  EXPECT_EQ(over.rc, 2);
  EXPECT_THAT(over.err, HasSubstr("already exists"));
  EXPECT_EQ(ReadText(tokens_), with_r2);

  // The running daemon read the file at start; a new daemon on the same file accepts the token.
  DaemonProcess second;
  ASSERT_TRUE(second.Start({"--listen", "127.0.0.1:0", "--tokens", tokens_.string(), "--db",
                            (dir_ / "ev2.db").string(), "--key", (dir_ / "key.pem").string(),
                            "--allow-root", dir_.path().string()},
                           dir_ / "daemon2.log"))
      << second.log();
  std::string server = " --server " + second.address() + " --insecure-loopback --trust " +
                       trust_.string();
  CliResult with_token = RunCli("gate " + dst_.string() + server, dir_.path(),
                                StateEnv() + " CKPT_AUDIT_TOKEN=" + token);
  EXPECT_EQ(with_token.rc, 2);  // a reader may not call Gate ...
  EXPECT_THAT(with_token.err, HasSubstr("PERMISSION_DENIED"));
  CliResult no_token = RunCli("gate " + dst_.string() + server, dir_.path(), StateEnv());
  EXPECT_EQ(no_token.rc, 2);  // ... and without a token nobody is known at all
  EXPECT_THAT(no_token.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(second.Stop(), 0);
}

// A server that says PASS for everything, backs it with a decision envelope signed by a key the
// client does not trust, and an empty proof.
class PassEverythingServer final : public pb::AuditService::Service {
 public:
  PassEverythingServer() {
    auto key = evidence::SigningKey::Generate();
    envelope_ = *evidence::SignEnvelope(R"({"forged":true})", evidence::kInTotoPayloadType, *key);
  }
  grpc::Status Gate(grpc::ServerContext*, const pb::GateRequest*,
                    pb::GateResponse* out) override {
    out->set_pass(true);
    out->add_reasons("trust me");
    out->set_record_id(0);
    out->set_decision_id(1);
    out->set_manifest_root(std::string(64, 'a'));
    return grpc::Status::OK;
  }
  grpc::Status GetRecord(grpc::ServerContext*, const pb::GetRecordRequest* req,
                         pb::Record* out) override {
    out->set_id(req->id());
    out->set_envelope(envelope_);
    return grpc::Status::OK;
  }

 private:
  std::string envelope_;
};

TEST(DaemonCliGate, FakeServerSayingPassDoesNotPass) {
  TempDir dir;
  CliResult key = RunCli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                             (dir / "trust.txt").string(),
                         dir.path());
  ASSERT_EQ(key.rc, 0) << key.err;
  PassEverythingServer fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&fake);
  auto server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  CliResult gate = RunCli("gate /models/x --server 127.0.0.1:" + std::to_string(port) +
                              " --insecure-loopback --trust " + (dir / "trust.txt").string(),
                          dir.path(),
                          "XDG_STATE_HOME='" + dir.path().string() + "' CKPT_AUDIT_TOKEN=anything");
  EXPECT_NE(gate.rc, 0) << gate.out;
  EXPECT_EQ(gate.rc, 1) << gate.err;
  EXPECT_THAT(gate.out, HasSubstr("gate FAIL"));
  EXPECT_THAT(gate.out, HasSubstr("does not verify"));
  server->Shutdown();
}

// A server that answers every Gate with a canned response, and notes the authorization
// metadata of every call it received.
class CannedGateServer final : public pb::AuditService::Service {
 public:
  explicit CannedGateServer(pb::GateResponse answer) : answer_(std::move(answer)) {}
  grpc::Status Gate(grpc::ServerContext* ctx, const pb::GateRequest*,
                    pb::GateResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_;
    for (const auto& [key, value] : ctx->client_metadata()) {
      if (key == "authorization") authorization_.emplace_back(value.data(), value.size());
    }
    *out = answer_;
    return grpc::Status::OK;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::vector<std::string> authorization() {
    std::lock_guard<std::mutex> lock(mu_);
    return authorization_;
  }

 private:
  const pb::GateResponse answer_;
  std::mutex mu_;
  int calls_ = 0;
  std::vector<std::string> authorization_;
};

// The fake on a loopback port of its own.
struct FakeGate {
  explicit FakeGate(pb::GateResponse answer) : service(std::move(answer)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeGate() { server->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  CannedGateServer service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// Finding 1 (the CLI half), with real decisions: a genuine FAILED decision relabelled pass, and
// the same decision re-signed as PASSED by a key the client does not trust, never exit 0.
TEST_F(DaemonCliTest, GateBelievesOnlyTheSignedVerdict) {
  auto stub = Stub();
  pb::GateRequest req;
  req.set_root(dst_.string());
  pb::GateResponse real_fail;
  ASSERT_TRUE(stub->Gate(Ctx().get(), req, &real_fail).ok());
  ASSERT_FALSE(real_fail.pass());
  ASSERT_FALSE(real_fail.decision_envelope().empty());

  pb::GateResponse relabelled = real_fail;
  relabelled.set_pass(true);
  pb::GateResponse forged = real_fail;
  {
    auto rogue = *evidence::SigningKey::Generate();
    auto env = evidence::ParseEnvelope(real_fail.decision_envelope());
    auto vsa = nlohmann::json::parse(env->payload);
    vsa["predicate"]["verificationResult"] = "PASSED";
    forged.set_decision_envelope(
        *evidence::SignEnvelope(vsa.dump(), evidence::kInTotoPayloadType, rogue));
    forged.set_pass(true);
  }
  for (const pb::GateResponse* answer : {&relabelled, &forged}) {
    CannedGateServer fake(*answer);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake);
    auto server = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    CliResult r = RunCli("gate " + dst_.string() + " --trust " + trust_.string() +
                             " --server 127.0.0.1:" + std::to_string(port),
                         dir_.path(), StateEnv());
    EXPECT_EQ(r.rc, 1) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("does not verify"));
    server->Shutdown();
  }
}

// Issue 21 item 3: a genuine PASS the real daemon signed for this content, replayed by a fake
// server on the loopback port, is believed only for exactly what was asked: the same root,
// policy and source pin, the content the caller expects or finds on disk, within --max-age and
// not older than the newest decision this user already saw.
TEST_F(DaemonCliTest, GateBindsAReplayedPassToWhatWasAsked) {
  CliResult submit = Cli("submit " + dst_.string() + " --source " + src_.string() + " --json");
  ASSERT_EQ(submit.rc, 0) << submit.err;
  auto stub = Stub();
  pb::GateRequest req;
  req.set_root(dst_.string());
  pb::GateResponse good;
  ASSERT_TRUE(stub->Gate(Ctx().get(), req, &good).ok());
  ASSERT_TRUE(good.pass());

  FakeGate fake(good);
  ASSERT_NE(fake.port, 0);
  auto ask = [&](const std::string& root, const std::string& flags) {
    return RunCli("gate " + root + " --trust " + trust_.string() + " --server " +
                      fake.address() + " " + flags,
                  dir_.path(), StateEnv());
  };
  // Asked exactly what the decision is about: believed (the fake itself is sound).
  CliResult same = ask(dst_.string(), "");
  EXPECT_EQ(same.rc, 0) << same.out << same.err;
  CliResult local = ask(dst_.string(), "--verify-local --expect-root " + good.manifest_root());
  EXPECT_EQ(local.rc, 0) << local.out << local.err;

  struct Case {
    std::string root, flags;
    std::vector<std::string> named;  // both sides of the mismatch
  };
  const std::string other_content(64, 'c'), pin(64, 'd');
  const std::vector<Case> cases = {
      {src_.string(), "", {"about root " + dst_.string(), "not the requested " + src_.string()}},
      {dst_.string(), "--policy marlin-safe",
       {"under policy 'scale-window'", "not the requested 'marlin-safe'"}},
      {dst_.string(), "--source-manifest-root sha256:" + pin,
       {"rests on no pinned source", "not the requested --source-manifest-root " + pin}},
      {dst_.string(), "--expect-root " + other_content,
       {"about content " + good.manifest_root(), "not " + other_content + " (--expect-root)"}},
      {dst_.string(), "--max-age 0s", {"made at ", "more than --max-age 0 ago"}},
  };
  for (const Case& c : cases) {
    CliResult r = ask(c.root, c.flags);
    EXPECT_EQ(r.rc, 1) << c.root << " " << c.flags << "\n" << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("gate FAIL")) << c.flags;
    for (const std::string& n : c.named) EXPECT_THAT(r.out, HasSubstr(n)) << c.flags;
  }

  // The content changes on disk: the replayed PASS is about what was there before.
  std::string config = ReadText(dst_ / "config.json");
  ::ckpt::testing::WriteAll(dst_ / "config.json", config + " ");
  CliResult changed = ask(dst_.string(), "--verify-local");
  EXPECT_EQ(changed.rc, 1) << changed.out << changed.err;
  EXPECT_THAT(changed.out, HasSubstr("about content " + good.manifest_root()));
  EXPECT_THAT(changed.out, HasSubstr("(the local fingerprint)"));

  // The real daemon now signs a FAIL for the changed content; this user has seen it, so the
  // older PASS replayed afterwards is refused even without --verify-local.
  CliResult real = Cli("gate " + dst_.string() + " --trust " + trust_.string());
  EXPECT_EQ(real.rc, 1) << real.out << real.err;
  CliResult replayed = ask(dst_.string(), "");
  EXPECT_EQ(replayed.rc, 1) << replayed.out << replayed.err;
  EXPECT_THAT(replayed.out, HasSubstr("before the newest decision already seen"));
  struct stat st;
  ASSERT_EQ(::stat((dir_ / "state/ckpt-audit/gate-decisions.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Issue 21 item 3: without TLS the CLI cannot know who listens on the port, so the token is not
// sent unless the user accepts that for a loopback address.
TEST(DaemonCliGate, TokenGoesToAnUnverifiedServerOnlyWithInsecureLoopback) {
  TempDir dir;
  CliResult key = RunCli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                             (dir / "trust.txt").string(),
                         dir.path());
  ASSERT_EQ(key.rc, 0) << key.err;
  FakeGate fake(pb::GateResponse{});
  ASSERT_NE(fake.port, 0);
  const std::string gate = "gate /models/x --server " + fake.address() + " --trust " +
                           (dir / "trust.txt").string();
  const std::string env =
      "XDG_STATE_HOME='" + dir.path().string() + "' CKPT_AUDIT_TOKEN=ckpt_secret-token";
  CliResult refused = RunCli(gate, dir.path(), env);
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_THAT(refused.err, HasSubstr("refusing to send a token to " + fake.address()));
  EXPECT_THAT(refused.err, HasSubstr("--insecure-loopback"));
  EXPECT_EQ(fake.service.calls(), 0);
  EXPECT_TRUE(fake.service.authorization().empty());

  CliResult accepted = RunCli(gate + " --insecure-loopback", dir.path(), env);
  EXPECT_EQ(accepted.rc, 1) << accepted.err;  // answered: an empty answer is a FAIL
  EXPECT_THAT(fake.service.authorization(),
              ::testing::ElementsAre("Bearer ckpt_secret-token"));
}

// Issue 21 item 5: a root under an allowed directory by name only ("<allowed>/../elsewhere/..."),
// whose real path is longer than PATH_MAX, is refused naming it: never audited, gated or signed
// under the name it was given.
TEST_F(DaemonCliTest, RootWhoseRealPathCannotBeEstablishedIsRefused) {
  TempDir outside;
  ::ckpt::testing::DeepTree tree(outside.path());
  fs::copy(::ckpt::testing::Fixture("mini-kimi-nvfp4"), tree.deep() / "M",
           fs::copy_options::recursive);
  const std::string asked =
      (dir_ / ".." / outside.path().filename() / "h5" / "M").string();
  ASSERT_EQ(asked.rfind(dir_.path().string() + "/", 0), 0u);  // looks allowed by its name
  auto stub = Stub();
  pb::GateRequest gate;
  gate.set_root(asked);
  pb::GateResponse resp;
  grpc::Status g = stub->Gate(Ctx().get(), gate, &resp);
  EXPECT_THAT(g.error_code(), ::testing::AnyOf(grpc::StatusCode::INVALID_ARGUMENT,
                                               grpc::StatusCode::PERMISSION_DENIED))
      << g.error_message() << " pass=" << resp.pass();
  EXPECT_THAT(g.error_message(), HasSubstr(asked));
  pb::StartAuditRequest start;
  start.set_root(asked);
  pb::Job job;
  grpc::Status s = stub->StartAudit(Ctx().get(), start, &job);
  EXPECT_THAT(s.error_code(), ::testing::AnyOf(grpc::StatusCode::INVALID_ARGUMENT,
                                               grpc::StatusCode::PERMISSION_DENIED))
      << s.error_message() << " job " << job.id();
  EXPECT_THAT(s.error_message(), HasSubstr(asked));
}

// Finding 9: a second daemon, or a CLI writer, on a log a daemon holds is refused clearly;
// readers are not.
TEST_F(DaemonCliTest, OneWriterPerLog) {
  DaemonProcess second;
  EXPECT_FALSE(second.Start(DaemonArgs(), dir_ / "second.log"));
  EXPECT_EQ(second.exit_code(), 2);
  EXPECT_THAT(second.log(), HasSubstr("another writer (pid"));
  std::string db = (dir_ / "ev.db").string();
  CliResult audit = RunCli("audit " + dst_.string() + " --db " + db + " --key " +
                               (dir_ / "key.pem").string(),
                           dir_.path());
  EXPECT_EQ(audit.rc, 2);
  EXPECT_THAT(audit.err, HasSubstr("another writer (pid"));
  EXPECT_EQ(RunCli("query --db " + db, dir_.path()).rc, 0);
  CliResult verify = RunCli("verify-log --db " + db + " --trust " + trust_.string(), dir_.path());
  EXPECT_EQ(verify.rc, 0) << verify.out << verify.err;
}

// Finding 5: kill -9 with a job running and two queued. After a restart every id answers and
// all three run to completion, the interrupted one again from its start (it was never silently
// left INTERRUPTED: issue 21, item 7). New ids are new.
TEST_F(DaemonCliTest, JobsSurviveKillDashNine) {
  // The two jobs behind the slow one are queued first, so the kill follows the running state.
  fs::path slow = SlowRoot("slow", 1);
  auto stub = Stub();
  std::string running = Start(*stub, slow, "");
  std::vector<std::string> queued = {Start(*stub, dst_, src_), Start(*stub, src_, "")};
  WaitRunning(*stub, running);
  for (const auto& id : queued) ASSERT_EQ(GetJob(*stub, id).state(), pb::JOB_STATE_QUEUED);

  KillAndRestart(stub, "restarted.log");
  EXPECT_THAT(daemon_.log(), HasSubstr("job " + running + ": the daemon stopped while this job "
                                       "ran (interruption 1 of at most 3)"));
  pb::Job rerun = WatchToEnd(*stub, running);
  EXPECT_EQ(rerun.state(), pb::JOB_STATE_SUCCEEDED) << rerun.error_message();
  EXPECT_GE(rerun.record_id(), 0);
  for (const auto& id : queued) {
    pb::Job job = WatchToEnd(*stub, id);
    EXPECT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << id << " " << job.error_message();
    EXPECT_EQ(job.verdict(), "pass");
  }
  std::set<std::string> ids(queued.begin(), queued.end());
  ids.insert(running);
  EXPECT_TRUE(ids.insert(Start(*stub, dst_, src_)).second);
}

// A job that the daemon's stop keeps interrupting (here: killed while it runs, four times) is
// re-run at most 3 times, then FAILED with the reason, which GetJob and WatchJob both carry.
TEST_F(DaemonCliTest, AJobInterruptedFourTimesFailsWithTheReason) {
  fs::path slow = SlowRoot("slow", 16);  // does not finish within the test
  auto stub = Stub();
  std::string id = Start(*stub, slow, "");
  for (int kill = 1; kill <= 4; ++kill) {
    WaitRunning(*stub, id);
    if (HasFailure()) return;
    KillAndRestart(stub, "restart-" + std::to_string(kill) + ".log");
  }
  pb::Job failed = GetJob(*stub, id);
  EXPECT_EQ(failed.state(), pb::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("interrupted 4 times"));
  std::string said;
  pb::Job watched = WatchToEnd(*stub, id, &said);
  EXPECT_EQ(watched.state(), pb::JOB_STATE_FAILED);
  EXPECT_THAT(said, HasSubstr("interrupted 4 times"));
  EXPECT_THAT(daemon_.log(), HasSubstr("job " + id + ": interrupted 4 times"));
}

// Issue 21, item 8: whoever can write the database file inserts a job row naming an invoker
// nobody authenticated as, while the daemon is stopped. At the next start that row is refused
// (FAILED, a log line), never run, and its invoker is in no signed record; a genuine job queued
// beside it still runs.
TEST_F(DaemonCliTest, AForgedJobRowIsNeverRunNorSigned) {
  fs::path slow = SlowRoot("slow", 1);
  auto stub = Stub();
  std::string running = Start(*stub, slow, "");
  std::string genuine = Start(*stub, dst_, src_);
  WaitRunning(*stub, running);
  ASSERT_EQ(GetJob(*stub, genuine).state(), pb::JOB_STATE_QUEUED);
  daemon_.Kill();
  stub.reset();

  const std::string db = (dir_ / "ev.db").string();
  const std::string forged = "job-000900-0badc0de";
  const std::string insert =
      "INSERT INTO jobs(seq, id, root, source_root, policy, root_map, invoker, state, verdict,"
      " record_id, error_code, error_message, created_at, finished_at) VALUES(900, '" + forged +
      "', '" + dst_.string() + "', '" + src_.string() + "', '', '', 'admin:release-manager',"
      " 'queued', '', -1, 0, '', '2026-12-01T00:00:00.000Z', '')";
  ASSERT_EQ(std::system(("sqlite3 '" + db + "' \"" + insert + "\"").c_str()), 0);

  ASSERT_TRUE(daemon_.Start(DaemonArgs(), dir_ / "restarted.log")) << daemon_.log();
  stub = Stub();
  EXPECT_THAT(daemon_.log(), HasSubstr("job " + forged + ": refused at start"));
  pb::Job refused = GetJob(*stub, forged);
  EXPECT_EQ(refused.state(), pb::JOB_STATE_FAILED);
  EXPECT_THAT(refused.error_message(), HasSubstr("not one the daemon wrote"));
  EXPECT_EQ(refused.record_id(), -1);
  for (const std::string& id : {running, genuine}) {
    pb::Job job = WatchToEnd(*stub, id);
    EXPECT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << id << " " << job.error_message();
  }
  // Every signed statement in the log names the genuine caller, none the forged one.
  const fs::path dump = dir_ / "envelopes.txt";
  ASSERT_EQ(std::system(("sqlite3 '" + db + "' 'SELECT CAST(envelope AS TEXT) FROM entries' > '" +
                         dump.string() + "'").c_str()),
            0);
  std::istringstream lines(ReadText(dump));
  int signed_by_admin = 0, records = 0;
  for (std::string line; std::getline(lines, line);) {
    auto env = evidence::ParseEnvelope(line);
    ASSERT_TRUE(env.ok()) << env.status();
    ++records;
    EXPECT_THAT(env->payload, Not(HasSubstr("release-manager")));
    signed_by_admin += env->payload.find("admin:ci-admin") != std::string::npos;
  }
  EXPECT_GE(records, 2);
  EXPECT_GE(signed_by_admin, 2);
}

}  // namespace
}  // namespace ckpt
