// The shipped ckpt-auditd binary's transport and operability: start-up refusals (plaintext off
// loopback, no auth decision, a token file others can write, a world-readable TLS key), TLS and
// mutual TLS with a throwaway PKI, grpc.health.v1 without a token, Prometheus /metrics over
// loopback HTTP, and one JSON log line per call, which a stalled stderr never holds up.
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/daemon/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::DaemonProcess;
using ::ckpt::testing::RawUnaryCall;
using ::ckpt::testing::ScrapeMetrics;
using ::ckpt::testing::ReadText;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::TestPki;
using ::testing::HasSubstr;

class DaemonTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    CliResult key = RunCli("keys generate --out " + (dir_ / "key.pem").string() + " --trust " +
                               (dir_ / "trust.txt").string(),
                           dir_.path());
    ASSERT_EQ(key.rc, 0) << key.err;
    CliResult token = RunCli("tokens add --file " + tokens_.string() +
                                 " --role gate --name ci-gate",
                             dir_.path());
    ASSERT_EQ(token.rc, 0) << token.err;
    token_ = token.out.substr(0, token.out.find('\n'));
  }

  std::vector<std::string> Base(const std::string& listen = "127.0.0.1:0") {
    return {"--listen", listen, "--db", (dir_ / "ev.db").string(), "--key",
            (dir_ / "key.pem").string(), "--allow-root", dir_.path().string()};
  }
  std::vector<std::string> With(std::vector<std::string> a, std::vector<std::string> more) {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
  // Runs the daemon expecting it to refuse to start; its log.
  std::string Refused(const std::vector<std::string>& args) {
    DaemonProcess d;
    EXPECT_FALSE(d.Start(args, dir_ / "refused.log")) << "the daemon started with a bad setup";
    d.Stop();
    EXPECT_EQ(d.exit_code(), 2);
    return d.log();
  }
  CliResult Gate(const DaemonProcess& d, const std::string& flags, bool with_token = true) {
    return RunCli("gate " + dst_.string() + " --server " + d.address() + " --trust " +
                      (dir_ / "trust.txt").string() + " " + flags,
                  dir_.path(), "XDG_STATE_HOME='" + (dir_ / "state").string() + "' " +
                                   (with_token ? "CKPT_AUDIT_TOKEN=" + token_ : ""));
  }

  TempDir dir_;
  fs::path dst_, tokens_ = dir_ / "tokens";
  std::string token_;
};

TEST_F(DaemonTransportTest, RefusesUnsafeSetupsAtStart) {
  // A non-loopback address without TLS, whatever else is configured. (192.0.2.1 is a
  // documentation address: the check must refuse before any bind is tried.)
  std::string log = Refused(With(Base("192.0.2.1:7433"), {"--tokens", tokens_.string()}));
  EXPECT_THAT(log, HasSubstr("without TLS"));
  TestPki pki;
  ASSERT_TRUE(MakeTestPki(dir_.path(), &pki));
  log = Refused(With(Base("192.0.2.1:7433"), {"--tokens", tokens_.string(), "--client-ca",
                                              pki.ca.string()}));
  EXPECT_THAT(log, HasSubstr("needs --tls-cert"));
  // No tokens and no explicit --insecure-no-auth.
  EXPECT_THAT(Refused(Base()), HasSubstr("--insecure-no-auth"));
  // --insecure-no-auth off loopback even with TLS.
  EXPECT_THAT(Refused(With(Base("192.0.2.1:7433"),
                           {"--insecure-no-auth", "--tls-cert", pki.server_cert.string(),
                            "--tls-key", pki.server_key.string()})),
              HasSubstr("only a loopback"));
  // A token file others can write.
  ::chmod(tokens_.c_str(), 0666);
  EXPECT_THAT(Refused(With(Base(), {"--tokens", tokens_.string()})),
              HasSubstr("writable by group and others"));
  ::chmod(tokens_.c_str(), 0600);
  // A TLS key others can read.
  ::chmod(pki.server_key.c_str(), 0644);
  EXPECT_THAT(Refused(With(Base(), {"--tokens", tokens_.string(), "--tls-cert",
                                    pki.server_cert.string(), "--tls-key",
                                    pki.server_key.string()})),
              HasSubstr("readable by others"));
  // Metrics off loopback without --metrics-public.
  EXPECT_THAT(Refused(With(Base(), {"--tokens", tokens_.string(), "--metrics-listen",
                                    "0.0.0.0:9464"})),
              HasSubstr("--metrics-public"));
}

TEST_F(DaemonTransportTest, InsecureNoAuthServesLoopbackWithoutTokens) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(With(Base(), {"--insecure-no-auth"}), dir_ / "d.log")) << d.log();
  CliResult gate = Gate(d, "", /*with_token=*/false);
  EXPECT_EQ(gate.rc, 1) << gate.err;  // answered (nothing audited yet)
  EXPECT_THAT(gate.out, HasSubstr("no audit record"));
  EXPECT_EQ(d.Stop(), 0);
}

TEST_F(DaemonTransportTest, TlsAndMutualTls) {
  TestPki pki;
  ASSERT_TRUE(MakeTestPki(dir_.path(), &pki)) << ReadText(dir_ / "openssl.log");
  {
    DaemonProcess d;
    ASSERT_TRUE(d.Start(With(Base(), {"--tokens", tokens_.string(), "--tls-cert",
                                      pki.server_cert.string(), "--tls-key",
                                      pki.server_key.string()}),
                        dir_ / "tls.log"))
        << d.log();
    CliResult ok = Gate(d, "--tls-ca " + pki.ca.string());
    EXPECT_EQ(ok.rc, 1) << ok.err;  // answered over TLS (nothing audited yet)
    EXPECT_THAT(ok.out, HasSubstr("no audit record"));
    CliResult no_token = Gate(d, "--tls-ca " + pki.ca.string(), /*with_token=*/false);
    EXPECT_EQ(no_token.rc, 2);
    EXPECT_THAT(no_token.err, HasSubstr("UNAUTHENTICATED"));
    CliResult wrong_ca = Gate(d, "--tls-ca " + pki.other_ca.string());
    EXPECT_EQ(wrong_ca.rc, 2);  // the server's certificate does not verify
    EXPECT_THAT(wrong_ca.err, HasSubstr("UNAVAILABLE"));
    CliResult plaintext = Gate(d, "");
    EXPECT_EQ(plaintext.rc, 2);
    EXPECT_EQ(d.Stop(), 0);
  }
  DaemonProcess m;
  ASSERT_TRUE(m.Start(With(Base(), {"--tokens", tokens_.string(), "--tls-cert",
                                    pki.server_cert.string(), "--tls-key",
                                    pki.server_key.string(), "--client-ca", pki.ca.string()}),
                      dir_ / "mtls.log"))
      << m.log();
  CliResult no_cert = Gate(m, "--tls-ca " + pki.ca.string());
  EXPECT_EQ(no_cert.rc, 2);
  EXPECT_THAT(no_cert.err, HasSubstr("UNAVAILABLE"));
  CliResult with_cert = Gate(m, "--tls-ca " + pki.ca.string() + " --tls-cert " +
                                    pki.client_cert.string() + " --tls-key " +
                                    pki.client_key.string());
  EXPECT_EQ(with_cert.rc, 1) << with_cert.err;
  EXPECT_THAT(with_cert.out, HasSubstr("no audit record"));
  // --key names a signing key everywhere else; the client's TLS files are --tls-* only.
  CliResult old_names = Gate(m, "--tls-ca " + pki.ca.string() + " --cert " +
                                    pki.client_cert.string() + " --key " +
                                    pki.client_key.string());
  EXPECT_EQ(old_names.rc, 2);
  EXPECT_THAT(old_names.err, HasSubstr("--cert"));
  EXPECT_EQ(m.Stop(), 0);
  // The call was logged as one JSON line naming the token and the verified certificate.
  bool seen = false;
  const std::vector<std::string> lines = absl::StrSplit(m.log(), '\n', absl::SkipEmpty());
  for (const std::string& line : lines) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (j.value("method", "") == "/ckpt_audit.v1.AuditService/Gate" &&
        j.value("code", "") == "OK") {
      EXPECT_THAT(j.value("invoker", ""), HasSubstr("gate:ci-gate cert:"));
      EXPECT_THAT(j.value("invoker", ""), HasSubstr("CN=ckpt-test-client"));
      EXPECT_TRUE(j.contains("latency_ms"));
      EXPECT_TRUE(j.contains("time"));
      seen = true;
    }
  }
  EXPECT_TRUE(seen) << m.log();
}

// The value of the metric line that contains every one of `parts`, or -1.
double MetricValue(const std::string& body, const std::vector<std::string>& parts) {
  const std::vector<std::string> lines = absl::StrSplit(body, '\n');
  for (const std::string& line : lines) {
    if (line.empty() || line[0] == '#') continue;
    bool all = true;
    for (const auto& p : parts) all &= line.find(p) != std::string::npos;
    if (all) return std::stod(std::string(line.substr(line.rfind(' ') + 1)));
  }
  return -1;
}

TEST_F(DaemonTransportTest, HealthWithoutTokenAndMetricsOverLoopback) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start(With(Base(), {"--tokens", tokens_.string(), "--metrics-listen",
                                    "127.0.0.1:0", "--health-listen", "127.0.0.1:0"}),
                      dir_ / "d.log"))
      << d.log();
  ASSERT_GT(d.metrics_port(), 0) << d.log();
  ASSERT_GT(d.health_port(), 0) << d.log();

  // grpc.health.v1 Check with no token: HealthCheckResponse{status: SERVING (1)} = 08 01.
  std::string bytes;
  grpc::Status health = RawUnaryCall(d.address(), "/grpc.health.v1.Health/Check", "", &bytes);
  ASSERT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  // The health-only port answers health, and has no AuditService at all.
  std::string health_only = "127.0.0.1:" + std::to_string(d.health_port());
  ASSERT_TRUE(RawUnaryCall(health_only, "/grpc.health.v1.Health/Check", "", &bytes).ok());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  EXPECT_EQ(RawUnaryCall(health_only, "/ckpt_audit.v1.AuditService/QueryAudits", "", &bytes)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // A request message that does not parse (a varint cut short) is the caller's error; a method
  // the service lacks stays UNIMPLEMENTED.
  for (const char* m : {"GetJob", "Gate"}) {
    const std::string method = std::string("/ckpt_audit.v1.AuditService/") + m;
    EXPECT_EQ(RawUnaryCall(d.address(), method, "\xff\xff\xff", &bytes).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << m;
  }
  EXPECT_EQ(RawUnaryCall(d.address(), "/ckpt_audit.v1.AuditService/NoSuchMethod", "", &bytes)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);

  CliResult denied = Gate(d, "", /*with_token=*/false);
  EXPECT_EQ(denied.rc, 2);
  CliResult answered = Gate(d, "--insecure-loopback");
  EXPECT_EQ(answered.rc, 1) << answered.err;

  std::string body = ScrapeMetrics(d.metrics_port());
  ASSERT_THAT(body, HasSubstr("200 OK"));
  const std::string gate = "method=\"/ckpt_audit.v1.AuditService/Gate\"";
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_rpcs_handled_total{", gate, "code=\"OK\""}), 1);
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_rpcs_handled_total{", gate,
                               "code=\"UNAUTHENTICATED\""}),
            1);
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_rpcs_handled_total{",
                               "method=\"/grpc.health.v1.Health/Check\"", "code=\"OK\""}),
            1);
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_rpcs_handled_total{", gate,
                               "code=\"INVALID_ARGUMENT\""}),
            1);  // the request that did not parse
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_rpc_duration_seconds_count{", gate}), 3);
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_gate_decisions_total{", "result=\"fail\""}), 1);
  EXPECT_EQ(MetricValue(body, {"ckpt_auditd_jobs_queued "}), 0);
  EXPECT_EQ(d.Stop(), 0);
}

// The daemon writes its log to stderr, which a supervisor reads (journald, a container
// runtime). If that reader stalls, the daemon must go on answering: past 1 MiB of waiting lines
// it drops lines and counts them, and it never waits for stderr on a call's path. If the
// reader goes away, the daemon goes on too (no death by SIGPIPE).
TEST_F(DaemonTransportTest, AStderrNobodyReadsNeverHoldsUpCalls) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  ASSERT_GT(::fcntl(fds[1], F_SETPIPE_SZ, 4096), 0);  // room for a few dozen lines
  std::vector<std::string> args = With(Base(), {"--insecure-no-auth"});
  args.insert(args.begin(), ::ckpt::testing::DaemonBinary());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  // Reads what the daemon wrote, waiting at most `ms` for more; false when nothing came.
  std::string text;
  auto read_more = [&](int ms) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return false;
    char buf[65536];
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) text.append(buf, static_cast<size_t>(n));
    return n > 0;
  };
  std::smatch port;
  const std::regex port_re("serving on port ([0-9]+)");
  for (int i = 0; i < 100 && !std::regex_search(text, port, port_re); ++i) read_more(100);
  ASSERT_TRUE(std::regex_search(text, port, port_re)) << text;
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + port[1].str(),
                                             grpc::InsecureChannelCredentials()));
  // `n` health checks, each logged; how many were answered.
  auto calls = [&](int n) {
    for (int i = 0; i < n; ++i) {
      grpc::Status s = RawUnaryCall(stub, "/grpc.health.v1.Health/Check", "", nullptr,
                                    std::chrono::seconds(3));
      if (!s.ok()) {
        ADD_FAILURE() << "call " << i << ": " << s.error_message();
        return i;
      }
    }
    return n;
  };

  // Nobody reads stderr now: after a few dozen lines the daemon's writes cannot complete.
  // 10,000 lines of ~170 bytes are more than the 1 MiB that may wait.
  constexpr int kCalls = 10000;
  EXPECT_EQ(calls(kCalls), kCalls);
  // Read again: the waiting lines come, then the count of those dropped, and every line is
  // whole JSON.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (text.find("log lines dropped") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    read_more(100);
  }
  while (read_more(300)) {
  }
  int dropped = 0, logged = 0;
  for (const std::string& line :
       std::vector<std::string>(absl::StrSplit(text, '\n', absl::SkipEmpty()))) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << line;
    if (j.value("method", "") == "/grpc.health.v1.Health/Check") ++logged;
    if (j.value("msg", "") == "log lines dropped") dropped += j.value("dropped", 0);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_GT(logged, 5000);  // the 1 MiB that waited
  EXPECT_EQ(logged + dropped, kCalls) << "every call's line is either written or counted";

  // The reader goes away: writes fail, calls are still answered, SIGTERM still stops it.
  ::close(fds[0]);
  EXPECT_EQ(calls(50), 50);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace ckpt
