// Test helpers for the shipped ckpt-auditd binary: start it on a loopback port and stop it with
// SIGTERM, or run it expecting it to refuse to start; raw calls to it (a unary call of any
// bytes, a TCP connection, a /metrics scrape); and a throwaway PKI (CA, server and client
// certificates) made with the openssl command line.
#ifndef CKPT_TESTS_DAEMON_DAEMON_PROCESS_H_
#define CKPT_TESTS_DAEMON_DAEMON_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

extern char** environ;

namespace ckpt::testing {

inline std::string DaemonBinary() {
  return std::string(::ckpt::testing::kBinaryDir) + "/services/daemon/ckpt-auditd";
}

inline std::string ReadText(const std::filesystem::path& p) {
  auto bytes = ReadAll(p);
  return std::string(bytes.begin(), bytes.end());
}

class DaemonProcess {
 public:
  DaemonProcess() = default;
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess() { Stop(); }

  // Spawns ckpt-auditd with `args` (stderr to `log`), through the command `wrapper` if given
  // (such as prlimit), and waits, at most 30 s (a loaded 2-core CI machine), for the line that
  // names its port; a daemon that exits is seen at once. False when it exited or never said so;
  // log() then says why.
  bool Start(const std::vector<std::string>& args, const std::filesystem::path& log,
             const std::vector<std::string>& wrapper = {}) {
    log_ = log;
    std::vector<std::string> all = wrapper;
    all.push_back(DaemonBinary());
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    int rc = posix_spawn(&pid_, all[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return false;
    std::regex port_re("serving on port ([0-9]+)");
    std::regex metrics_re("\"metrics_port\":([0-9]+)");
    std::regex health_re("\"health_port\":([0-9]+)");
    for (int i = 0; i < 600; ++i) {
      std::string text = ReadText(log);
      std::smatch m;
      if (std::regex_search(text, m, port_re)) {
        port_ = std::stoi(m[1].str());
        if (std::regex_search(text, m, metrics_re)) metrics_port_ = std::stoi(m[1].str());
        if (std::regex_search(text, m, health_re)) health_port_ = std::stoi(m[1].str());
        return true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_code_ = ExitCode(status);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // SIGTERM and wait; the exit code (0 for a clean stop, 128 + N for a death by signal N, as a
  // shell reports it), or -1 if it was not running.
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_code_ = ExitCode(status);
    return exit_code_;
  }

  // SIGKILL and reap, as a crash or the OOM killer would stop it.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }
  int exit_code() const { return exit_code_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return ReadText(log_); }

 private:
  static int ExitCode(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;
  int exit_code_ = -1;
  std::filesystem::path log_;
};

// A unary call of `method` with the request message `request` (any bytes) and no token, within
// `deadline`; the response's bytes in `*response` if given.
inline grpc::Status RawUnaryCall(grpc::GenericStub& stub, const std::string& method,
                                 const std::string& request = "",
                                 std::string* response = nullptr,
                                 std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  grpc::Slice message(request);
  grpc::ByteBuffer request_buffer(&message, 1), answer;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request_buffer, &answer,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  if (response != nullptr) {
    response->clear();
    std::vector<grpc::Slice> slices;
    if (s.ok() && answer.Dump(&slices).ok()) {
      for (const auto& sl : slices) {
        response->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
    }
  }
  return s;
}

// The same on a new plaintext channel to `address`.
inline grpc::Status RawUnaryCall(const std::string& address, const std::string& method,
                                 const std::string& request = "",
                                 std::string* response = nullptr,
                                 std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  return RawUnaryCall(stub, method, request, response, deadline);
}

// A TCP connection to 127.0.0.1:`port`; -1 if it failed.
inline int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics over loopback HTTP/1.0: the whole response (status line, headers, body), or what
// came of it within 10 s.
inline std::string ScrapeMetrics(int port) {
  std::string out;
  int fd = ConnectLoopback(port);
  if (fd < 0) return out;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
    char buf[8192];
    for (ssize_t n; out.size() < (8 << 20) && (n = ::read(fd, buf, sizeof buf)) > 0;) {
      out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// A CA, a server certificate for 127.0.0.1/localhost and a client certificate
// (CN=ckpt-test-client), all signed by the CA, in `dir`; keys are mode 0600.
struct TestPki {
  std::filesystem::path ca, server_cert, server_key, client_cert, client_key;
  std::filesystem::path other_ca;  // an unrelated CA
};

inline bool MakeTestPki(const std::filesystem::path& dir, TestPki* pki) {
  auto p = [&](const char* name) { return (dir / name).string(); };
  WriteAll(dir / "server.ext",
           std::string("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                       "extendedKeyUsage=serverAuth\n"));
  WriteAll(dir / "client.ext",
           std::string("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"));
  const std::string q = " 2>>'" + p("openssl.log") + "' >/dev/null";
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
  std::vector<std::string> cmds = {
      "openssl req -x509" + ec + " -keyout '" + p("ca.key") + "' -out '" + p("ca.pem") +
          "' -days 2 -subj /CN=ckpt-test-ca -addext basicConstraints=critical,CA:TRUE"
          " -addext keyUsage=critical,keyCertSign,cRLSign" + q,
      "openssl req -x509" + ec + " -keyout '" + p("other-ca.key") + "' -out '" +
          p("other-ca.pem") + "' -days 2 -subj /CN=other-ca" + q,
      "openssl req" + ec + " -keyout '" + p("server.key") + "' -out '" + p("server.csr") +
          "' -subj /CN=localhost" + q,
      "openssl x509 -req -in '" + p("server.csr") + "' -CA '" + p("ca.pem") + "' -CAkey '" +
          p("ca.key") + "' -CAcreateserial -days 2 -extfile '" + p("server.ext") + "' -out '" +
          p("server.pem") + "'" + q,
      "openssl req" + ec + " -keyout '" + p("client.key") + "' -out '" + p("client.csr") +
          "' -subj /O=ckpt-test/CN=ckpt-test-client" + q,
      "openssl x509 -req -in '" + p("client.csr") + "' -CA '" + p("ca.pem") + "' -CAkey '" +
          p("ca.key") + "' -CAcreateserial -days 2 -extfile '" + p("client.ext") + "' -out '" +
          p("client.pem") + "'" + q,
  };
  for (const std::string& c : cmds) {
    if (std::system(c.c_str()) != 0) return false;
  }
  for (const char* key : {"ca.key", "server.key", "client.key", "other-ca.key"}) {
    ::chmod(p(key).c_str(), 0600);
  }
  *pki = {dir / "ca.pem", dir / "server.pem", dir / "server.key", dir / "client.pem",
          dir / "client.key", dir / "other-ca.pem"};
  return true;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_DAEMON_PROCESS_H_
