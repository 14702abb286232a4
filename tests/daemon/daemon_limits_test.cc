// The shipped ckpt-auditd binary against an anonymous loopback peer that spends the daemon's
// resources (docs/daemon.md, "Limits"): connections beyond the open-file limit, a half-sent
// request to /metrics, a 4 MiB request that would parse into ~120 MiB before its token is
// looked at, and reflection streams held open by the hundred. Each failed on the daemon before
// its limits (outside reviews, 2026-12-01).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/daemon/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::ckpt::testing::CliResult;
using ::ckpt::testing::ConnectLoopback;
using ::ckpt::testing::DaemonProcess;
using ::ckpt::testing::RawUnaryCall;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::ScrapeMetrics;
using ::ckpt::testing::TempDir;

// kB of the peak resident set (VmHWM) of `pid`.
long PeakRssKb(pid_t pid) {
  std::string status = ::ckpt::testing::ReadText("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("VmHWM:");
  return at == std::string::npos ? -1 : std::stol(status.substr(at + 6));
}

class DaemonLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CliResult key = RunCli("keys generate --out " + (dir_ / "key.pem").string(), dir_.path());
    ASSERT_EQ(key.rc, 0) << key.err;
  }
  std::vector<std::string> Args() {
    return {"--listen", "127.0.0.1:0", "--insecure-no-auth", "--db", (dir_ / "ev.db").string(),
            "--key", (dir_ / "key.pem").string(), "--allow-root", dir_.path().string(),
            "--metrics-listen", "127.0.0.1:0"};
  }
  TempDir dir_;
};

// The daemon run to its exit with `args` (no listener is opened when they are refused): its
// exit code (-1 if killed) and what it printed.
std::pair<int, std::string> RunDaemon(const std::vector<std::string>& args) {
  std::string cmd =
      "'" + std::string(::ckpt::testing::kBinaryDir) + "/services/daemon/ckpt-auditd'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  std::string said;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) said.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

// Flags that size thread pools and splits are bounded (README.md, "Limits"): past the bound
// the daemon does not start, exits 2 and says which flag and range.
TEST_F(DaemonLimitsTest, WorkersThreadsAndPartsFlagsHaveAMaximum) {
  for (const char* flag : {"--workers", "--threads-per-audit", "--slurm-max-parts"}) {
    std::vector<std::string> args = Args();
    args.insert(args.end(), {flag, "100000"});
    auto [rc, said] = RunDaemon(args);
    EXPECT_EQ(rc, 2) << flag << ": " << said;
    EXPECT_NE(said.find(flag), std::string::npos) << said;
    EXPECT_NE(said.find("not in range"), std::string::npos) << said;
  }
}

// Usage errors exit 2 as the CLI's do (README.md, "Exit codes"); --version names the version,
// commit, build type and CUDA architectures and exits 0.
TEST_F(DaemonLimitsTest, UsageErrorsExitTwoAndVersionSaysWhatWasBuilt) {
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--no-such-flag"}, std::vector<std::string>{"--workers", "x"},
        std::vector<std::string>{}}) {
    auto [rc, said] = RunDaemon(bad);
    EXPECT_EQ(rc, 2) << said;
  }
  auto [rc, said] = RunDaemon({"--version"});
  EXPECT_EQ(rc, 0) << said;
  for (const char* part :
       {"ckpt-auditd ", "\ncommit ", "\nbuild type ", "\nCUDA architectures "}) {
    EXPECT_NE(said.find(part), std::string::npos) << part << " in " << said;
  }
}

// Connections take file descriptors. The daemon raises its soft open-file limit to the hard
// one at start, so a soft limit of 128 (a systemd unit's default is 1024) is not what a peer
// has to exhaust.
TEST_F(DaemonLimitsTest, RaisesItsOpenFileLimitToTheHardLimit) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 1024) GTEST_SKIP() << "hard open-file limit " << saved.rlim_max;
  DaemonProcess d;
  rlimit low = saved;
  low.rlim_cur = 128;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const bool started = d.Start(Args(), dir_ / "d.log");
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(started) << d.log();
  EXPECT_NE(d.log().find("\"max_open_files\":" + std::to_string(saved.rlim_max)),
            std::string::npos)
      << d.log();
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    int fd = ConnectLoopback(d.port());
    if (fd >= 0) fds.push_back(fd);
  }
  EXPECT_TRUE(RawUnaryCall(d.address(), "/grpc.health.v1.Health/Check", "", nullptr,
                           std::chrono::seconds(10)).ok());
  for (int fd : fds) ::close(fd);
  EXPECT_EQ(d.Stop(), 0);
}

// When the hard limit itself runs out, gRPC 1.51 stops accepting on the port for good after the
// failed accept. A daemon that cannot accept connections any more says so and exits (code 3),
// so that its supervisor starts it again, rather than stay up answering nobody (its health
// port, a separate listener, would have kept saying SERVING).
TEST_F(DaemonLimitsTest, ExitsWhenAListenerStopsAccepting) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(Args(), dir_ / "d.log", {"/usr/bin/prlimit", "--nofile=128:128", "--"}))
      << d.log();
  ASSERT_TRUE(RawUnaryCall(d.address(), "/grpc.health.v1.Health/Check", "", nullptr,
                           std::chrono::seconds(10)).ok());
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    int fd = ConnectLoopback(d.port());
    if (fd >= 0) fds.push_back(fd);
  }
  const std::string said = "stopped accepting connections";
  for (int i = 0; i < 200 && d.log().find(said) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int fd : fds) ::close(fd);
  EXPECT_NE(d.log().find(said), std::string::npos) << d.log().substr(0, 4000);
  EXPECT_EQ(d.Stop(), 3);
}

// One client sends the start of an HTTP request to /metrics and stops. Prometheus' scrape from
// another connection must still be answered (a scrape times out after 10 s by default).
TEST_F(DaemonLimitsTest, MetricsAnswerWhileAnotherClientHoldsAHalfSentRequest) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(Args(), dir_ / "d.log")) << d.log();
  int slow = ConnectLoopback(d.metrics_port());
  ASSERT_GE(slow, 0);
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  ASSERT_EQ(::write(slow, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  const std::string out = ScrapeMetrics(d.metrics_port());
  ::close(slow);
  EXPECT_NE(out.find("200 OK"), std::string::npos)
      << "no scrape answer within 10 s while another connection held a half-sent request";
  EXPECT_EQ(d.Stop(), 0);
}

// A request's size is bounded by what a valid request can need (16 root_map entries of two
// paths, a root, a source, forward_layers of 4096 characters: well under 1 MiB). A peer that
// sends 4 MiB of empty root_map entries must not make the daemon build two million messages
// (about 120 MiB of heap) for one call.
TEST_F(DaemonLimitsTest, ARequestOfTwoMillionEmptyEntriesIsNotParsedIntoHundredsOfMiB) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(Args(), dir_ / "d.log")) << d.log();
  ASSERT_TRUE(RawUnaryCall(d.address(), "/grpc.health.v1.Health/Check", "", nullptr,
                           std::chrono::seconds(10)).ok());
  const long before = PeakRssKb(d.pid());
  std::string request;
  for (size_t i = 0; i + 2 <= (4u << 20) - 64; i += 2) request.append("\x22\x00", 2);
  grpc::Status s = RawUnaryCall(d.address(), "/ckpt_audit.v1.AuditService/StartAudit", request);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  const long grown = PeakRssKb(d.pid()) - before;
  EXPECT_LT(grown, 32 * 1024) << "peak RSS grew by " << grown << " kB for one request ("
                              << s.error_message() << ")";
  EXPECT_EQ(d.Stop(), 0);
}

// Issue 21, item 7: anonymous reflection streams, held open, used to take every thread of the
// synchronous methods (400 of them), and WatchJob was one of those methods: an authenticated
// caller could no longer follow its audit (RESOURCE_EXHAUSTED). Now reflection has those
// threads to itself; the flooder is answered RESOURCE_EXHAUSTED, while an authenticated
// StartAudit and WatchJob, and health checks, go through.
TEST_F(DaemonLimitsTest, AReflectionFloodLeavesAuthenticatedAuditsAndWatchesAlone) {
  namespace pb = ckpt_audit::v1;
  const std::filesystem::path model = ::ckpt::testing::CopyFixture("mini-kimi-nvfp4", dir_);
  const std::string tokens = (dir_ / "tokens").string();
  CliResult token =
      RunCli("tokens add --file " + tokens + " --role auditor --name ci", dir_.path());
  ASSERT_EQ(token.rc, 0) << token.err;
  std::vector<std::string> args = Args();
  args[2] = "--tokens";
  args.insert(args.begin() + 3, tokens);
  DaemonProcess d;
  ASSERT_TRUE(d.Start(args, dir_ / "d.log")) << d.log();

  // 450 streams on 5 connections (at most 100 streams each), none of which ever sends a request.
  constexpr int kConnections = 5, kStreamsEach = 90, kStreams = kConnections * kStreamsEach;
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::Status status;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<Stream>> flood;
  for (int c = 0; c < kConnections; ++c) {
    grpc::ChannelArguments channel_args;
    channel_args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    stubs.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        d.address(), grpc::InsecureChannelCredentials(), channel_args)));
    for (int i = 0; i < kStreamsEach; ++i) {
      auto& st = flood.emplace_back(std::make_unique<Stream>());
      const uintptr_t n = flood.size() - 1;
      st->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      st->call = stubs.back()->PrepareCall(
          &st->ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
      st->call->StartCall(reinterpret_cast<void*>(2 * n));
      st->call->Finish(&st->status, reinterpret_cast<void*>(2 * n + 1));
    }
  }
  // Until the server has refused more streams than 400 threads would leave over.
  int events = 0, exhausted = 0;
  auto take = [&](std::chrono::milliseconds wait) {
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + wait) !=
        grpc::CompletionQueue::GOT_EVENT) {
      return false;
    }
    ++events;
    const uintptr_t t = reinterpret_cast<uintptr_t>(tag);
    if (t % 2 == 1 &&
        flood[t / 2]->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
    }
    return true;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (exhausted < kStreams - 400 && std::chrono::steady_clock::now() < until) {
    take(std::chrono::milliseconds(100));
  }
  EXPECT_GE(exhausted, kStreams - 400) << "the flood did not fill the synchronous threads";

  // Meanwhile: health, and an authenticated audit followed to its end.
  EXPECT_TRUE(RawUnaryCall(d.address(), "/grpc.health.v1.Health/Check", "", nullptr,
                           std::chrono::seconds(10)).ok());
  auto stub = pb::AuditService::NewStub(
      grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  const std::string bearer = "Bearer " + token.out.substr(0, token.out.find('\n'));
  pb::StartAuditRequest start;
  start.set_root(model.string());
  pb::Job job;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", bearer);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = stub->StartAudit(&ctx, start, &job);
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", bearer);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  pb::WatchJobRequest watch;
  watch.set_id(job.id());
  auto reader = stub->WatchJob(&ctx, watch);
  pb::JobEvent e, last;
  while (reader->Read(&e)) last = e;
  grpc::Status watched = reader->Finish();
  EXPECT_TRUE(watched.ok()) << watched.error_code() << " " << watched.error_message();
  EXPECT_TRUE(last.done());
  EXPECT_EQ(last.job().state(), pb::JOB_STATE_SUCCEEDED) << last.job().error_message();

  for (auto& st : flood) st->ctx.TryCancel();
  while (events < 2 * kStreams && take(std::chrono::seconds(10))) {
  }
  EXPECT_EQ(events, 2 * kStreams);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace ckpt
