// bench_evidence: how fast the evidence log appends signed records durably and answers proofs.
//
// 1. Appends: --appends full audits' worth of work each (build a record payload, DSSE-sign it,
//    Append with synchronous=FULL, which also signs a checkpoint), against a baseline measured
//    in the same run on the same filesystem: 4 KiB write + fdatasync loops (the fastest any
//    durable commit can be there). Prints appends/s and the ratio to fsyncs/s.
// 2. Proofs: builds logs of each --sizes entries through the batch path (one transaction and
//    one checkpoint per 10,000 entries), then times --proofs random inclusion and consistency
//    proofs through the normal API (EvidenceLog, SQLite-stored subtree hashes), verifying each
//    (verification not timed), against the same proofs from an in-memory tree.
// Results: docs/PERFORMANCE.md, "Evidence log".
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "storage/evidence_log.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

evidence::EvidenceRecord Record(int i) {
  evidence::EvidenceRecord r;
  r.root = absl::StrCat("/models/bench-", i % 7);
  std::string name = absl::StrCat("shard-", i);
  r.subjects = {{"model.safetensors", ToHex(Sha256Of(evidence::AsBytes(name)))},
                {evidence::kManifestRootSubject, ToHex(Sha256Of(evidence::AsBytes(r.root)))}};
  r.policy = {"scale-window", "1", {{"max_span", 17}}};
  evidence::CheckResult c;
  c.name = "scale_window";
  c.counts["tensors"] = 96;
  c.counts["over_span_groups"] = i % 3;
  c.verdict = i % 3 ? evidence::Verdict::kFail : evidence::Verdict::kPass;
  r.checks.push_back(c);
  r.environment = evidence::CollectEnvironment();
  r.started_at = evidence::Rfc3339Now();
  r.finished_at = r.started_at;
  return r;
}

double FsyncsPerSecond(const fs::path& dir, int n) {
  fs::path p = dir / "fsync-baseline";
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char> page(4096, 'x');
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (::pwrite(fd, page.data(), page.size(), static_cast<off_t>(i) * 4096) != 4096) return -1;
    ::fdatasync(fd);
  }
  auto t1 = Clock::now();
  ::close(fd);
  fs::remove(p);
  return n / Seconds(t0, t1);
}

int BenchAppends(const fs::path& dir, int n, const evidence::SigningKey& key) {
  double baseline = FsyncsPerSecond(dir, n);
  auto log = storage::EvidenceLog::Open((dir / "appends.db").string(), true, "bench/appends");
  if (!log.ok()) {
    std::fprintf(stderr, "%s\n", log.status().ToString().c_str());
    return 2;
  }
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto payload = evidence::RecordPayload(Record(i));
    std::string env = *evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, key);
    auto r = (*log)->Append(env, key);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 2;
    }
  }
  double rate = n / Seconds(t0, Clock::now());
  std::printf("appends (synchronous=FULL, signed record + signed checkpoint): %d in a row\n", n);
  std::printf("  %.0f appends/s; baseline 4 KiB write+fdatasync: %.0f/s; ratio %.2f\n", rate,
              baseline, rate / baseline);
  return 0;
}

template <typename F>
double MicrosPer(int n, F&& fn) {
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) fn(i);
  return Seconds(t0, Clock::now()) * 1e6 / n;
}

int BenchProofs(const fs::path& dir, uint64_t size, int proofs, const evidence::SigningKey& key) {
  std::string path = (dir / absl::StrCat("proofs-", size, ".db")).string();
  auto log = storage::EvidenceLog::Open(path, true, "bench/proofs");
  if (!log.ok()) return 2;
  std::vector<std::string> distinct;
  for (int i = 0; i < 64; ++i) {
    distinct.push_back(
        *evidence::SignEnvelope(*evidence::RecordPayload(Record(i)), evidence::kInTotoPayloadType,
                               key));
  }
  storage::MemoryTree mem;
  auto t0 = Clock::now();
  constexpr uint64_t kBatch = 10000;
  std::vector<std::string> batch;
  for (uint64_t done = 0; done < size;) {
    batch.clear();
    for (uint64_t i = 0; i < kBatch && done + i < size; ++i) {
      batch.push_back(distinct[(done + i) % distinct.size()]);
      mem.Append(storage::LeafHash(evidence::AsBytes(batch.back())));
    }
    auto r = (*log)->AppendBatch(batch, key);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
      return 2;
    }
    done += batch.size();
  }
  double build = Seconds(t0, Clock::now());
  std::mt19937_64 rng(size);
  std::vector<uint64_t> idx(proofs), old_sizes(proofs);
  for (int i = 0; i < proofs; ++i) {
    idx[i] = rng() % size;
    old_sizes[i] = 1 + rng() % size;
  }
  storage::Hash root = *(*log)->RootAt(size);
  int bad = 0;
  std::vector<std::vector<storage::Hash>> out(proofs);
  double incl = MicrosPer(proofs, [&](int i) { out[i] = *(*log)->InclusionProof(idx[i], size); });
  for (int i = 0; i < proofs; ++i) {
    storage::Hash leaf = *(*log)->Node(0, idx[i]);
    if (!storage::VerifyInclusion(leaf, idx[i], size, out[i], root).ok()) ++bad;
  }
  double cons = MicrosPer(proofs, [&](int i) {
    out[i] = *(*log)->ConsistencyProof(old_sizes[i], size);
  });
  for (int i = 0; i < proofs; ++i) {
    if (!storage::VerifyConsistency(old_sizes[i], size, out[i], *(*log)->RootAt(old_sizes[i]), root)
             .ok()) {
      ++bad;
    }
  }
  double mem_incl = MicrosPer(proofs, [&](int i) { out[i] = *storage::InclusionProof(mem, idx[i], size); });
  double mem_cons =
      MicrosPer(proofs, [&](int i) { out[i] = *storage::ConsistencyProof(mem, old_sizes[i], size); });
  std::printf("proofs at %llu entries (built in %.1f s, %.0f entries/s batched; db %.0f MiB):\n",
              static_cast<unsigned long long>(size), build, size / build,
              fs::file_size(path) / 1048576.0);
  std::printf("  inclusion   %.1f us/proof (in-memory tree %.2f us; ratio %.1f)\n", incl,
              mem_incl, incl / mem_incl);
  std::printf("  consistency %.1f us/proof (in-memory tree %.2f us; ratio %.1f)\n", cons,
              mem_cons, cons / mem_cons);
  std::printf("  %d of %d proofs failed to verify\n", bad, 2 * proofs);
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  CLI::App app{"bench_evidence: evidence log append and proof performance"};
  std::string dir = ".";
  int appends = 300, proofs = 1000;
  std::string sizes = "100000,1000000";
  bool keep = false;
  app.add_option("--dir", dir, "directory on the filesystem to measure (default: .)");
  app.add_option("--appends", appends, "signed appends to time");
  app.add_option("--sizes", sizes, "log sizes for proof timing, comma-separated (0: skip)");
  app.add_option("--proofs", proofs, "proofs of each kind per size");
  app.add_flag("--keep", keep, "keep the databases");
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  fs::path work = fs::path(dir) / absl::StrCat("bench-evidence-", ::getpid());
  fs::create_directories(work);
  auto key = *ckpt::evidence::SigningKey::Generate();
  int rc = ckpt::BenchAppends(work, appends, key);
  for (absl::string_view s : absl::StrSplit(sizes, ',', absl::SkipEmpty())) {
    uint64_t n = std::stoull(std::string(s));
    if (rc == 0 && n > 0) rc = ckpt::BenchProofs(work, n, proofs, key);
  }
  if (!keep) fs::remove_all(work);
  return rc;
}
