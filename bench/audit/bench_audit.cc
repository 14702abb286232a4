// bench_audit: what a pair audit costs against reading and hashing the same two trees.
//
// Generates (or reuses, with --dir) a synthetic MXFP4 source of --size-gib
// (bench/common/synthetic_checkpoint.h) and its lossless NVFP4 transcode, then measures in the
// same run, each from a cold page cache (every file fsync'ed and dropped with
// POSIX_FADV_DONTNEED before the run) and again warm (after a plain read of both trees):
//   read   plain pread of every file of both trees, files in parallel on all threads
//   hash   the same plus SHA-256 of every file (OpenSSL), files in parallel
//   audit  the pair audit (core/audit: one read of both trees streamed in --memory-window,
//          fingerprints, structure, scale-window, pair)
// and prints wall time, CPU time, bytes read from storage (/proc/self/io read_bytes) over the
// bytes of both trees, and peak RSS (VmHWM, reset before each run), with ratios to `hash`, and
// the audit's peak kept bytes (core/io/tree_stream.h).
// Targets (issue 8): cold audit <= 1.05x hash; storage bytes / tree bytes = 1.00; warm audit
// CPU <= 1.6x hash. Results: docs/PERFORMANCE.md.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/common/synthetic_checkpoint.h"
#include "core/audit/audit_checks.h"
#include "core/parallel.h"
#include "core/quant/transcode.h"
#include "core/sha256.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

void Die(const absl::Status& s) {
  std::fprintf(stderr, "bench_audit: %s\n", s.ToString().c_str());
  std::exit(2);
}

std::vector<fs::path> FilesOf(const std::vector<fs::path>& roots) {
  std::vector<fs::path> out;
  for (const fs::path& r : roots) {
    for (const auto& e : fs::recursive_directory_iterator(r)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return fs::file_size(a) > fs::file_size(b); });
  return out;
}

void DropCache(const std::vector<fs::path>& files) {
  for (const fs::path& p : files) {
    int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Reads every file front to back in 8 MiB preads, files in parallel; hashes when asked.
void ReadAll(const std::vector<fs::path>& files, unsigned threads, bool hash) {
  ParallelFor(files.size(), threads, [&](size_t i) {
    int fd = ::open(files[i].c_str(), O_RDONLY);
    if (fd < 0) return absl::OkStatus();
    std::vector<uint8_t> buf(8 << 20);
    Sha256 h;
    off_t pos = 0;
    for (ssize_t n; (n = ::pread(fd, buf.data(), buf.size(), pos)) > 0; pos += n) {
      if (hash) h.Update(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)));
    }
    ::close(fd);
    h.Finish();
    return absl::OkStatus();
  }).IgnoreError();
}

uint64_t ProcValue(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size()));
  }
  return 0;
}

double CpuSeconds() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Run {
  double wall = 0, cpu = 0;
  uint64_t storage_bytes = 0, peak_rss_kib = 0;
};

Run Measure(const std::function<void()>& fn) {
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM
  const uint64_t io0 = ProcValue("/proc/self/io", "read_bytes: ");
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  Run r;
  r.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cpu = CpuSeconds() - cpu0;
  r.storage_bytes = ProcValue("/proc/self/io", "read_bytes: ") - io0;
  r.peak_rss_kib = ProcValue("/proc/self/status", "VmHWM:");
  return r;
}

void Print(const char* name, const Run& r, const Run& hash, uint64_t tree_bytes) {
  std::printf("  %-6s wall %7.3f s (x%.2f of hash)  cpu %7.3f s (x%.2f)  storage/bytes %.3f  "
              "peak RSS %6.0f MiB\n",
              name, r.wall, r.wall / hash.wall, r.cpu, r.cpu / hash.cpu,
              static_cast<double>(r.storage_bytes) / tree_bytes, r.peak_rss_kib / 1024.0);
}

int Main(int argc, char** argv) {
  CLI::App app{"bench_audit: pair audit vs reading and hashing both trees"};
  double size_gib = 2.0;
  std::string dir;
  unsigned threads = 0;
  bool keep = false;
  uint64_t window = kDefaultMemoryWindow;
  app.add_option("--size-gib", size_gib, "approximate source size (whole 16-expert layers)");
  app.add_option("--dir", dir, "where to write the pair (default: a new dir under $TMPDIR)");
  app.add_option("--threads", threads, "threads (0 = all cores)");
  app.add_option("--memory-window", window, "the audit's memory window in bytes");
  app.add_flag("--keep", keep, "keep the generated pair (a later run with --dir reuses it)");
  CLI11_PARSE(app, argc, argv);
  if (threads == 0) threads = DefaultThreads();
  const fs::path root = dir.empty() ? fs::temp_directory_path() / ("bench-audit-" + std::to_string(::getpid()))
                                    : fs::path(dir);
  const bool reuse = fs::exists(root / "src") && fs::exists(root / "nvfp4");
  if (!reuse) {
    if (absl::Status s = bench::WriteSyntheticSource(root / "src", bench::LayersFor(size_gib)); !s.ok()) Die(s);
    quant::TranscodeOptions topt;
    topt.threads = threads;
    auto tr = quant::TranscodeToNvfp4((root / "src").string(), (root / "nvfp4").string(), topt,
                                      NoProgress());
    if (!tr.ok()) Die(tr.status());
  }
  const std::vector<fs::path> files = FilesOf({root / "src", root / "nvfp4"});
  uint64_t tree_bytes = 0;
  for (const fs::path& f : files) tree_bytes += fs::file_size(f);
  std::printf("pair%s: %.3f GiB in %zu files (source + derived); %u threads\n",
              reuse ? " (reused)" : "", tree_bytes / 1073741824.0, files.size(), threads);

  audit::AuditOptions o;
  o.root = (root / "nvfp4").string();
  o.source = (root / "src").string();
  o.threads = threads;
  o.memory_window = window;
  absl::StatusOr<evidence::EvidenceRecord> rec;
  audit::AuditStats stats;
  auto read = [&] { ReadAll(files, threads, false); };
  auto hash = [&] { ReadAll(files, threads, true); };
  auto audit = [&] { rec = audit::RunAudit(o, NoProgress(), &stats); };

  for (const bool cold : {true, false}) {
    auto prepare = [&] { cold ? DropCache(files) : read(); };
    prepare();
    const Run r_read = Measure(read);
    prepare();
    const Run r_hash = Measure(hash);
    prepare();
    const Run r_audit = Measure(audit);
    if (!rec.ok()) Die(rec.status());
    std::printf("%s page cache:\n", cold ? "cold" : "warm");
    Print("read", r_read, r_hash, tree_bytes);
    Print("hash", r_hash, r_hash, tree_bytes);
    Print("audit", r_audit, r_hash, tree_bytes);
    std::printf("  audit kept at most %.1f MiB (window %.1f MiB)\n", stats.peak_kept_bytes / 1048576.0,
                window / 1048576.0);
  }
  std::printf("audit verdict: %s\n", evidence::VerdictName(rec->OverallVerdict()).c_str());
  if (!keep && !reuse) fs::remove_all(root);
  return rec->OverallVerdict() == evidence::Verdict::kPass ? 0 : 1;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
