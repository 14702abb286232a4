// bench_daemon_load: starts ckpt-auditd (from the build tree) on a loopback port with a token
// file, audits the mini-kimi-nvfp4 fixture once, then runs N concurrent clients, each on its own
// connection, calling QueryAudits, GetRecord, GetInclusionProof, GetJob and Gate (on unchanged
// content) in turn until each has made --calls calls or --seconds have passed. The clients
// connect first and start calling together. Prints throughput, p50/p99 latency and errors per
// method, the connection set-up times, how late a thread sleeping 1 ms at a time woke during
// the load, and the daemon's RSS before and after, split into heap, thread stacks and mapped
// files.
// docs/PERFORMANCE.md ("Daemon under load") records runs.
//
//   build/bench/daemon/bench_daemon_load [--clients 64] [--calls 200] [--seconds 30]
//                                        [--methods QueryAudits,GetRecord,...] [--rounds N]
//                                        [--daemon PATH]
//
// With --rounds N the load runs N times against the same daemon, and the daemon's RSS is
// printed after each round: memory that settles after the first round is what the daemon keeps
// for that many connections; memory that grows round after round would be a leak.
//
// Without --rate each client calls again as soon as its last call returns (a closed loop): the
// calls/s printed is the most the machine sustains, and the latencies are those of a saturated
// server, where 64 calls always wait their turn (mean latency = clients / throughput). With
// --rate R the clients together offer R calls/s on a fixed schedule (client c's i-th call is due
// at start + (i + c / clients) * clients / R), whatever the answers: the latency of a call is
// counted from the time it was due, so a call held back because the client's previous call was
// late counts that wait too.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/test_paths.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using Clock = std::chrono::steady_clock;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Run(const std::string& cmd) { return std::system(cmd.c_str()); }

// The daemon's resident memory in KiB, by what it is (from /proc/PID/smaps): pages of mapped
// files (code, libraries), thread stacks (anonymous mappings of exactly the stack size, the
// size glibc gives each thread), and other anonymous memory (the malloc heap and arenas).
struct Memory {
  long rss = 0, files = 0, stacks = 0, heap = 0;
  int threads = 0;
};

Memory ReadMemory(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  rlimit stack{};
  getrlimit(RLIMIT_STACK, &stack);
  Memory m;
  std::istringstream smaps(Slurp(proc + "/smaps"));
  std::string line;
  long* kind = nullptr;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    char perms[8] = {}, path[4096] = {};
    // "begin-end perms offset dev inode [path]"
    int n = std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %*s %4095s", &begin, &end, perms,
                        path);
    if (n >= 3) {
      if (path[0] == '/') {
        kind = &m.files;
      } else if (path[0] == 0 && end - begin == stack.rlim_cur) {
        kind = &m.stacks;
      } else {
        kind = &m.heap;
      }
    } else if (kind != nullptr && line.rfind("Rss:", 0) == 0) {
      *kind += std::stol(line.substr(4));
    }
  }
  m.rss = m.files + m.stacks + m.heap;
  std::istringstream status(Slurp(proc + "/status"));
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) m.threads = std::stoi(line.substr(8));
  }
  return m;
}

struct Samples {
  std::vector<double> ms;
  uint64_t errors = 0;
  std::string first_error;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_daemon_load: concurrent clients against ckpt-auditd on loopback"};
  int clients = 64, calls = 200, seconds = 30, rounds = 1;
  double rate = 0;
  app.add_option("--clients", clients, "concurrent clients, one connection each");
  app.add_option("--calls", calls, "calls per client (upper bound)");
  app.add_option("--seconds", seconds, "time limit for the load phase (upper bound)");
  app.add_option("--rate", rate, "calls/s offered by all clients together; 0: closed loop")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--rounds", rounds, "load phases against the same daemon")
      ->check(CLI::Range(1, 100));
  std::vector<std::string> methods = {"QueryAudits", "GetRecord", "GetInclusionProof", "GetJob",
                                      "Gate"};
  app.add_option("--methods", methods, "the methods each client calls in turn")
      ->delimiter(',')
      ->check(CLI::IsMember({"QueryAudits", "GetRecord", "GetInclusionProof", "GetJob", "Gate"}));
  // Another build of the daemon (a copy of an earlier commit's), to compare two daemons under
  // the same clients.
  std::string daemon = std::string(::ckpt::testing::kBinaryDir) + "/services/daemon/ckpt-auditd";
  app.add_option("--daemon", daemon, "the ckpt-auditd binary to start");
  CLI11_PARSE(app, argc, argv);
  // The clients share the cores with the daemon: abseil's debug-build deadlock detection (a
  // global lock on every gRPC mutex operation) would make them cost more than they must.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  const fs::path dir =
      fs::temp_directory_path() / absl::StrFormat("ckpt-bench-daemon-%d", getpid());
  fs::create_directories(dir / "models");
  const fs::path root = dir / "models" / "mini-kimi-nvfp4";
  const fs::path source = dir / "models" / "mini-kimi-mxfp4";
  fs::copy(fs::path(::ckpt::testing::kTestDataDir) / "mini-kimi-nvfp4", root, fs::copy_options::recursive);
  fs::copy(fs::path(::ckpt::testing::kTestDataDir) / "mini-kimi-mxfp4", source, fs::copy_options::recursive);
  const std::string cli = std::string(::ckpt::testing::kBinaryDir) + "/services/cli/ckpt-audit";
  const std::string d = dir.string();
  if (Run(cli + " keys generate --out " + d + "/key.pem >/dev/null") != 0 ||
      Run(cli + " tokens add --file " + d + "/tokens --role admin --name bench > " + d +
          "/token 2>/dev/null") != 0) {
    std::fprintf(stderr, "cannot create the key or token\n");
    return 2;
  }
  std::string token = Slurp(dir / "token");
  token = token.substr(0, token.find('\n'));

  std::vector<std::string> args = {daemon,         "--listen", "127.0.0.1:0",  "--tokens",
                                   d + "/tokens",  "--db",     d + "/ev.db",   "--key",
                                   d + "/key.pem", "--allow-root", d + "/models"};
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = d + "/daemon.log";
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  if (posix_spawn(&pid, daemon.c_str(), &actions, nullptr, cargv.data(), environ) != 0) return 2;
  posix_spawn_file_actions_destroy(&actions);
  std::string address;
  for (int i = 0; i < 200 && address.empty(); ++i) {
    std::smatch m;
    std::string text = Slurp(log);
    if (std::regex_search(text, m, std::regex("serving on port ([0-9]+)"))) {
      address = "127.0.0.1:" + m[1].str();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  auto stop = [&] {
    ::kill(pid, SIGTERM);
    int st = 0;
    ::waitpid(pid, &st, 0);
    fs::remove_all(dir);
  };
  if (address.empty()) {
    std::fprintf(stderr, "ckpt-auditd did not start:\n%s\n", Slurp(log).c_str());
    stop();
    return 2;
  }
  auto context = [&](grpc::ClientContext& ctx) {
    ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  };

  // One audit so that every read has something to read and Gate has a passing record.
  auto setup = pb::AuditService::NewStub(grpc::CreateChannel(address,
                                                             grpc::InsecureChannelCredentials()));
  pb::StartAuditRequest sreq;
  sreq.set_root(root.string());
  sreq.set_source_root(source.string());
  pb::Job job;
  {
    grpc::ClientContext ctx;
    context(ctx);
    if (!setup->StartAudit(&ctx, sreq, &job).ok()) return stop(), 2;
  }
  {
    grpc::ClientContext ctx;
    context(ctx);
    pb::WatchJobRequest w;
    w.set_id(job.id());
    auto reader = setup->WatchJob(&ctx, w);
    pb::JobEvent e;
    while (reader->Read(&e)) {
      if (e.done()) job = e.job();
    }
    reader->Finish();
  }
  if (job.verdict() != "pass") {
    std::fprintf(stderr, "setup audit did not pass: %s\n", job.error_message().c_str());
    return stop(), 2;
  }

  std::mutex mu;
  std::map<std::string, Samples> samples;
  std::atomic<uint64_t> total{0};
  std::string load_before;
  {
    std::ifstream in("/proc/loadavg");
    std::getline(in, load_before);
  }
  // Gates reuse a file's digest only once its ctime is older than the daemon's stable age
  // (2 s; docs/daemon.md "Gate cost and change detection"): the fixture was just copied, so
  // wait until it is, as a release gate run after its audit would find it.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const Memory before = ReadMemory(pid);
  std::vector<Memory> after_rounds;
  double elapsed = 0;
  Samples connects;  // per client and round: channel created to connection ready
  Samples sleeper;   // how late a thread that sleeps 1 ms at a time wakes during the load
  for (int round = 0; round < rounds; ++round) {
    // Every client connects first; the calls start together once all are connected, so the
    // latencies are of calls on open connections (a CI client keeps its channel), and the
    // connection set-up is reported on its own line.
    std::latch connected(clients), go(1);
    std::vector<double> connect_ms(static_cast<size_t>(clients));
    // char, not bool: the clients write their own elements concurrently.
    std::vector<char> connect_failed(static_cast<size_t>(clients));
    Clock::time_point start, deadline;
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) {
      threads.emplace_back([&, c] {
        grpc::ChannelArguments ch;
        ch.SetInt("ckpt.bench_client", c);  // a distinct argument: a connection of its own
        const auto t0 = Clock::now();
        auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), ch);
        connect_failed[c] = !channel->WaitForConnected(std::chrono::system_clock::now() +
                                                     std::chrono::seconds(10));
        connect_ms[c] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        auto stub = pb::AuditService::NewStub(channel);
        connected.count_down();
        go.wait();
        std::map<std::string, Samples> mine;
        const std::chrono::duration<double> interval(rate > 0 ? clients / rate : 0);
        for (int i = 0; i < calls; ++i) {
          // Closed loop: now. Fixed rate: when the schedule says, even if that has passed.
          const auto t0 = rate > 0 ? start + std::chrono::duration_cast<Clock::duration>(
                                                 interval * (i + double(c) / clients))
                                   : Clock::now();
          if (t0 >= deadline) break;
          std::this_thread::sleep_until(t0);
          const std::string& method = methods[static_cast<size_t>(i + c) % methods.size()];
          grpc::ClientContext ctx;
          context(ctx);
          grpc::Status s;
          if (method == "QueryAudits") {
            pb::QueryAuditsRequest q;
            q.set_root(root.string());
            pb::QueryAuditsResponse r;
            s = stub->QueryAudits(&ctx, q, &r);
          } else if (method == "GetRecord") {
            pb::GetRecordRequest q;
            q.set_id(job.record_id());
            pb::Record r;
            s = stub->GetRecord(&ctx, q, &r);
          } else if (method == "GetInclusionProof") {
            pb::GetInclusionProofRequest q;
            q.set_id(job.record_id());
            pb::InclusionProof r;
            s = stub->GetInclusionProof(&ctx, q, &r);
          } else if (method == "GetJob") {
            pb::GetJobRequest q;
            q.set_id(job.id());
            pb::Job r;
            s = stub->GetJob(&ctx, q, &r);
          } else {
            pb::GateRequest q;
            q.set_root(root.string());
            pb::GateResponse r;
            s = stub->Gate(&ctx, q, &r);
            if (s.ok() && !r.pass()) s = grpc::Status(grpc::StatusCode::INTERNAL, "gate failed");
          }
          Samples& m = mine[method];
          m.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
          if (!s.ok()) {
            if (m.errors++ == 0) m.first_error = s.error_message();
          }
          ++total;
        }
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [k, v] : mine) {
          Samples& all = samples[k];
          all.ms.insert(all.ms.end(), v.ms.begin(), v.ms.end());
          if (all.errors == 0 && v.errors) all.first_error = v.first_error;
          all.errors += v.errors;
        }
      });
    }
    connected.wait();
    start = Clock::now();
    deadline = start + std::chrono::seconds(seconds);
    go.count_down();
    // A thread that only sleeps 1 ms at a time wakes late when the cores are busy, or when the
    // machine itself stops running us (a virtual machine's host): a tail in the calls' latency
    // that the sleeper shows too was the machine's, not the daemon's.
    std::atomic<bool> load_done{false};
    std::thread watch([&] {
      while (!load_done) {
        const auto t = Clock::now();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        sleeper.ms.push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - t).count() - 1.0);
      }
    });
    for (auto& t : threads) t.join();
    load_done = true;
    watch.join();
    elapsed += std::chrono::duration<double>(Clock::now() - start).count();
    for (int c = 0; c < clients; ++c) {
      connects.ms.push_back(connect_ms[c]);
      if (connect_failed[c] && connects.errors++ == 0) {
        connects.first_error = "not connected in 10 s";
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));  // let the daemon settle
    after_rounds.push_back(ReadMemory(pid));
  }
  const Memory after = after_rounds.back();
  std::string load_after;
  {
    std::ifstream in("/proc/loadavg");
    std::getline(in, load_after);
  }

  std::printf("clients %d, calls/client <= %d, time limit %d s, rounds %d, %s; load average "
              "before: %s\n",
              clients, calls, seconds, rounds,
              rate > 0 ? absl::StrFormat("offered %.0f calls/s", rate).c_str() : "closed loop",
              load_before.c_str());
  std::printf("%-18s %8s %10s %9s %9s %9s %7s\n", "method", "calls", "calls/s", "p50 ms",
              "p99 ms", "max ms", "errors");
  uint64_t errors = 0;
  for (const std::string& m : methods) {
    const Samples& s = samples[m];
    errors += s.errors;
    std::printf("%-18s %8zu %10.1f %9.2f %9.2f %9.2f %7llu%s%s\n", m.c_str(), s.ms.size(),
                static_cast<double>(s.ms.size()) / elapsed, Percentile(s.ms, 0.50),
                Percentile(s.ms, 0.99), Percentile(s.ms, 1.0),
                static_cast<unsigned long long>(s.errors), s.errors ? "  first: " : "",
                s.first_error.c_str());
  }
  errors += connects.errors;
  std::printf("%-18s %8zu %10s %9.2f %9.2f %9.2f %7llu%s%s\n", "(connect)", connects.ms.size(), "",
              Percentile(connects.ms, 0.50), Percentile(connects.ms, 0.99),
              Percentile(connects.ms, 1.0), static_cast<unsigned long long>(connects.errors),
              connects.errors ? "  first: " : "", connects.first_error.c_str());
  std::printf("%-18s %8zu %10s %9.2f %9.2f %9.2f  (how late a 1 ms sleep woke)\n",
              "(1 ms sleeper)", sleeper.ms.size(), "", Percentile(sleeper.ms, 0.50),
              Percentile(sleeper.ms, 0.99), Percentile(sleeper.ms, 1.0));
  std::printf("total %llu calls in %.2f s = %.1f calls/s; errors %llu\n",
              static_cast<unsigned long long>(total.load()), elapsed,
              static_cast<double>(total.load()) / elapsed, static_cast<unsigned long long>(errors));
  const auto mib = [](long kib) { return static_cast<double>(kib) / 1024.0; };
  std::printf("daemon RSS before %.1f MiB, after %.1f MiB (%+.1f%%); load average after: %s\n",
              mib(before.rss), mib(after.rss),
              100.0 * static_cast<double>(after.rss - before.rss) / static_cast<double>(before.rss),
              load_after.c_str());
  std::printf("  of which: heap and other anonymous %.2f -> %.2f MiB, thread stacks %.2f -> %.2f "
              "MiB (threads %d -> %d), mapped files %.2f -> %.2f MiB\n",
              mib(before.heap), mib(after.heap), mib(before.stacks), mib(after.stacks),
              before.threads, after.threads, mib(before.files), mib(after.files));
  if (rounds > 1) {
    std::printf("daemon RSS after each round (MiB):");
    for (const Memory& m : after_rounds) std::printf(" %.1f", mib(m.rss));
    std::printf("\n");
  }
  stop();
  return errors == 0 ? 0 : 1;
}
