// ckpt-scale-gen: the real-geometry scale rig's tools (docs/PERFORMANCE.md, "Real-geometry
// scale rig"; bench/scale/run_scale.sh drives them).
//
//   ckpt-scale-gen gen --geometry kimi-k3 --layers 1 --format mxfp4 --out DIR [--seed S]
//       [--shard-size 18000000000|2G] [--threads T] [--experts E --hidden H ... overrides]
//     writes a synthetic checkpoint (bench/scale/scale_checkpoint.h) and prints one JSON line.
//   ckpt-scale-gen hash [--threads T] [--list] DIR...
//     the hashing baseline: SHA-256 (OpenSSL, core/sha256.h) of every file, files in parallel.
//   ckpt-scale-gen time --label NAME [--record FILE] -- COMMAND ARGS...
//     runs COMMAND, then prints (and appends to FILE) one JSON line: exit code, wall time, peak
//     RSS, bytes read from and written to storage, CPU time (wait4's rusage: COMMAND and the
//     children it waited for).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "bench/scale/scale_checkpoint.h"
#include "core/parallel.h"
#include "core/sha256.h"
#include "nlohmann/json.hpp"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "18000000000", "512K", "2M", "2G" (binary multiples). 0 on a malformed value.
uint64_t ParseSize(const std::string& s) {
  size_t used = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(used);
  const int shift = unit.empty() ? 0 : unit == "K" ? 10 : unit == "M" ? 20 : unit == "G" ? 30 : -1;
  if (shift < 0 || v > (~0ull >> shift)) return 0;
  return v << shift;
}

int Gen(const std::string& geometry, const std::map<std::string, uint64_t>& overrides,
        const std::string& format, const std::string& shard_size, const std::string& order,
        const std::string& out, ScaleOptions o) {
  absl::StatusOr<Geometry> g = GeometryNamed(geometry);
  if (!g.ok()) {
    std::fprintf(stderr, "ckpt-scale-gen: %s\n", g.status().ToString().c_str());
    return 2;
  }
  o.geometry = *g;
  for (const auto& [key, value] : overrides) {
    uint64_t* field = key == "hidden" ? &o.geometry.hidden
                    : key == "latent" ? &o.geometry.latent
                    : key == "intermediate" ? &o.geometry.intermediate
                    : key == "experts" ? &o.geometry.experts
                    : key == "top-k" ? &o.geometry.top_k
                    : key == "n-group" ? &o.geometry.n_group
                    : key == "topk-group" ? &o.geometry.topk_group
                    : key == "shared-intermediate" ? &o.geometry.shared_intermediate
                    : &o.geometry.vocab;
    *field = value;
  }
  if (format != "mxfp4" && format != "nvfp4") {
    std::fprintf(stderr, "ckpt-scale-gen: --format must be mxfp4 or nvfp4\n");
    return 2;
  }
  o.format = format == "nvfp4" ? ScaleFormat::kNvfp4 : ScaleFormat::kMxfp4;
  absl::StatusOr<TensorOrder> tensor_order = TensorOrderNamed(order);
  if (!tensor_order.ok()) {
    std::fprintf(stderr, "ckpt-scale-gen: --order: %s\n",
                 std::string(tensor_order.status().message()).c_str());
    return 2;
  }
  o.order = *tensor_order;
  o.shard_bytes = ParseSize(shard_size);
  if (o.shard_bytes == 0) {
    std::fprintf(stderr, "ckpt-scale-gen: bad --shard-size '%s'\n", shard_size.c_str());
    return 2;
  }
  absl::StatusOr<ScaleResult> r = WriteScaleCheckpoint(out, o);
  if (!r.ok()) {
    std::fprintf(stderr, "ckpt-scale-gen: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", json({{"out", out}, {"format", format}, {"geometry", geometry},
                            {"layers", o.layers}, {"order", order}, {"files", r->files},
                            {"tensors", r->tensors},
                            {"bytes", r->bytes}, {"seconds", r->seconds},
                            {"gb_per_s", r->bytes / r->seconds / 1e9}})
                          .dump()
                          .c_str());
  return 0;
}

int Hash(const std::vector<std::string>& dirs, unsigned threads, bool list) {
  std::vector<fs::path> files;
  for (const std::string& d : dirs) {
    for (const auto& e : fs::recursive_directory_iterator(d)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> digests(files.size());
  std::vector<uint64_t> sizes(files.size());
  const double start = Now();
  absl::Status st = ParallelFor(files.size(), threads, [&](size_t i) {
    const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(files[i].string(), ": open failed"));
    thread_local std::vector<uint8_t> buf(8u << 20);
    Sha256 h;
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) != 0;) {
      if (n < 0) {
        ::close(fd);
        return absl::DataLossError(absl::StrCat(files[i].string(), ": read failed"));
      }
      h.Update(std::span(buf.data(), static_cast<size_t>(n)));
      sizes[i] += static_cast<uint64_t>(n);
    }
    ::close(fd);
    const Digest d = h.Finish();
    digests[i] = ToHex(d);
    return absl::OkStatus();
  });
  const double seconds = Now() - start;
  if (!st.ok()) {
    std::fprintf(stderr, "ckpt-scale-gen hash: %s\n", st.ToString().c_str());
    return 1;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    bytes += sizes[i];
    if (list) std::printf("%s  %s\n", digests[i].c_str(), files[i].c_str());
  }
  if (!list) {
    std::printf("%s\n", json({{"files", files.size()}, {"bytes", bytes}, {"seconds", seconds},
                              {"gb_per_s", bytes / seconds / 1e9}})
                            .dump()
                            .c_str());
  }
  return 0;
}

int Time(const std::string& label, const std::string& record, std::vector<std::string> argv) {
  if (argv.empty()) {
    std::fprintf(stderr, "ckpt-scale-gen time: no command\n");
    return 2;
  }
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const double start = Now();
  const pid_t pid = ::fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "ckpt-scale-gen time: cannot run %s\n", args[0]);
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  const double wall = Now() - start;
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const json line = {
      {"label", label},
      {"rc", rc},
      {"wall_s", wall},
      {"peak_rss_mib", ru.ru_maxrss / 1024.0},
      // Linux counts storage I/O in 512-byte units here (task I/O accounting).
      {"read_bytes", static_cast<uint64_t>(ru.ru_inblock) * 512},
      {"write_bytes", static_cast<uint64_t>(ru.ru_oublock) * 512},
      {"user_s", ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6},
      {"sys_s", ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6}};
  std::fprintf(stderr, "%s\n", line.dump().c_str());
  if (!record.empty()) std::ofstream(record, std::ios::app) << line.dump() << "\n";
  return rc;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  using namespace ckpt::bench;
  CLI::App app{"ckpt-scale-gen: real-geometry synthetic checkpoints and their baselines"};
  app.require_subcommand(1);

  auto* gen = app.add_subcommand("gen", "write a synthetic checkpoint");
  std::string geometry = "kimi-k3", format = "mxfp4", shard_size = "18000000000", out;
  std::string order = "sorted";
  ScaleOptions o;
  std::map<std::string, uint64_t> overrides;
  gen->add_option("--geometry", geometry, "kimi-k3 | deepseek-v3 | gpt-oss-120b");
  gen->add_option("--layers", o.layers, "MoE layers (default 1)");
  gen->add_option("--format", format, "mxfp4 (source) | nvfp4 (its lossless transcode)");
  gen->add_option("--shard-size", shard_size, "source bytes per shard (K/M/G binary suffixes)");
  gen->add_option("--seed", o.seed, "seed (same seed, same bytes)");
  gen->add_option("--order", order,
                  "where tensors lie: sorted (the reference writer's) | model | reverse | shuffle");
  gen->add_option("--threads", o.threads, "writer threads (0: all cores)");
  gen->add_option("--out", out, "output directory (must not exist)")->required();
  static const char* kOverrides[] = {"hidden", "latent", "intermediate", "experts", "top-k",
                                     "n-group", "topk-group", "shared-intermediate", "vocab"};
  std::map<std::string, uint64_t> values;
  for (const char* k : kOverrides) {
    gen->add_option(std::string("--") + k, values[k], std::string("override the geometry's ") + k);
  }

  auto* hash = app.add_subcommand("hash", "SHA-256 of every file under DIRs, files in parallel");
  std::vector<std::string> dirs;
  unsigned hash_threads = 0;
  bool list = false;
  hash->add_option("DIR", dirs, "directories")->required();
  hash->add_option("--threads", hash_threads, "threads (0: all cores)");
  hash->add_flag("--list", list, "print 'digest  path' per file instead of the totals");

  auto* time = app.add_subcommand("time", "run a command and report its rusage as JSON");
  std::string label, record;
  std::vector<std::string> command;
  time->add_option("--label", label, "name of the measurement");
  time->add_option("--record", record, "also append the JSON line to this file");
  time->add_option("COMMAND", command, "command and arguments (after --)")->required();

  CLI11_PARSE(app, argc, argv);
  if (gen->parsed()) {
    for (const char* k : kOverrides) {
      if (gen->count(std::string("--") + k)) overrides[k] = values[k];
    }
    return Gen(geometry, overrides, format, shard_size, order, out, o);
  }
  if (hash->parsed()) return Hash(dirs, hash_threads, list);
  return Time(label, record, command);
}
