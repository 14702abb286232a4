// The shipped ckpt-auditd binary against an anonymous loopback peer that spends the daemon's
// resources (docs/daemon.md, "Limits"): connections beyond the open-file limit, a half-sent
// request to /metrics, and a 4 MiB request that would parse into ~120 MiB before its token is
// looked at. Each failed on the daemon before its limits (an outside review, 2026-12-01).
#include <sys/resource.h>
#include <unistd.h>

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

}  // namespace
}  // namespace ckpt
