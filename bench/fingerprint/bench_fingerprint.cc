// bench_fingerprint: how close FingerprintTree gets to the machine's SHA-256 limit.
//
// Writes a synthetic checkpoint (half of --size as --shards safetensors shards, half as one
// large safetensors file), then times several fingerprint variants on --threads threads and
// prints each one's throughput as a ratio of `openssl speed -multi <threads> -evp sha256`
// (16384-byte blocks), measured in the same run just before each variant. Two ratios per
// variant: checkpoint bytes per second (what a user waits for) and SHA-256 input bytes per
// second (how much of the machine's hashing capacity the variant used; file + tensor digests
// hash every byte twice). Results: docs/PERFORMANCE.md, "Fingerprinting".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/fingerprint/fingerprint.h"
#include "core/parallel.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// Writes a safetensors file of `bytes` bytes of tensor data in U8 tensors of <= tensor_bytes.
void WriteShard(const fs::path& p, uint64_t bytes, uint64_t tensor_bytes, uint64_t seed) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (int i = 0; off < bytes; ++i) {
    uint64_t n = std::min(tensor_bytes, bytes - off);
    h["layers." + std::to_string(i) + ".weight"] = {
        {"dtype", "U8"}, {"shape", {n}}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = DumpJson(h);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);  // little-endian host
  out << header;
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> block((8u << 20) / 8);
  for (uint64_t done = 0; done < bytes;) {
    for (uint64_t& w : block) w = rng();
    uint64_t n = std::min<uint64_t>(block.size() * 8, bytes - done);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    done += n;
  }
}

// Aggregate SHA-256 bytes/s of `threads` processes on 16 KiB blocks, or -1.
double OpensslSpeed(unsigned threads, int seconds) {
  std::string cmd = "openssl speed -multi " + std::to_string(threads) +
                    " -evp sha256 -bytes 16384 -seconds " + std::to_string(seconds) +
                    " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char line[512];
  double rate = -1;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string s(line);
    // The summary row: "sha256   865843.63k" (thousands of bytes per second).
    if (s.rfind("sha256", 0) == 0 || s.rfind("evp", 0) == 0) {
      size_t k = s.find_last_of('k');
      size_t start = s.find_last_of(" \t", k);
      if (k != std::string::npos && start != std::string::npos) {
        rate = std::stod(s.substr(start + 1, k - start - 1)) * 1000;
      }
    }
  }
  ::pclose(p);
  return rate;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string line;
  std::getline(in, line);
  return line + "\n";
}

struct Variant {
  const char* name;
  const char* tree;  // "multi" or "big"
  OmsMode mode;
  bool file_digests, tensor_digests;
};

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  using namespace ckpt;
  CLI::App app{"Fingerprint throughput vs openssl speed (see docs/PERFORMANCE.md)"};
  std::string dir = "/tmp/ckpt-bench-fingerprint";
  double size_gib = 4;
  unsigned threads = DefaultThreads();
  int shards = 8, repeats = 3, openssl_seconds = 3;
  uint64_t shard_size = 256ull << 20;
  bool keep = false;
  app.add_option("--dir", dir, "where to write the synthetic checkpoint");
  app.add_option("--size-gib", size_gib, "total size: half in shards, half in one big file");
  app.add_option("--threads", threads, "worker threads (default: all cores)");
  app.add_option("--shards", shards, "number of shard files");
  app.add_option("--repeats", repeats, "timed runs per variant (median reported)");
  app.add_option("--oms-shard-size", shard_size, "byte range size for oms-shards variants");
  app.add_option("--openssl-seconds", openssl_seconds, "openssl speed duration");
  app.add_flag("--keep", keep, "keep the generated files");
  CLI11_PARSE(app, argc, argv);

  namespace fs = std::filesystem;
  const uint64_t total = static_cast<uint64_t>(size_gib * (1ull << 30));
  const uint64_t tensor_bytes = 64ull << 20;
  fs::create_directories(fs::path(dir) / "multi");
  fs::create_directories(fs::path(dir) / "big");
  std::printf("writing %.2f GiB under %s ...\n", size_gib, dir.c_str());
  for (int i = 0; i < shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, shards);
    WriteShard(fs::path(dir) / "multi" / name, total / 2 / shards, tensor_bytes, i);
  }
  WriteShard(fs::path(dir) / "big/model.safetensors", total / 2, tensor_bytes, 99);

  const Variant variants[] = {
      {"shards: file digests (oms)", "multi", OmsMode::kFiles, true, false},
      {"shards: file + tensor digests", "multi", OmsMode::kFiles, true, true},
      {"big file: file digest (oms)", "big", OmsMode::kFiles, true, false},
      {"big file: file + tensor digests", "big", OmsMode::kFiles, true, true},
      {"big file: oms-shards, no file digest", "big", OmsMode::kShards, false, false},
      {"big file: oms-shards + tensors, no file dg", "big", OmsMode::kShards, false, true},
  };
  // The machine may be shared: each variant is compared with an openssl run made right
  // before it, and the load average is printed so a reader can judge the noise.
  std::printf("load average at start: %s", LoadAverage().c_str());
  double single_core = OpensslSpeed(1, openssl_seconds);
  std::printf("threads %u; openssl speed -evp sha256, 16384-byte blocks: 1 process %.0f MB/s\n",
              threads, single_core / 1e6);
  std::printf("%-44s %8s %9s %9s %9s %8s %8s\n", "variant (median of runs)", "seconds",
              "ckpt MB/s", "SHA MB/s", "limit", "ckpt/lim", "SHA/lim");
  for (const Variant& v : variants) {
    FingerprintOptions o;
    o.threads = threads;
    o.manifest_mode = v.mode;
    o.shard_size = shard_size;
    o.file_digests = v.file_digests;
    o.tensor_digests = v.tensor_digests;
    std::string root = (fs::path(dir) / v.tree).string();
    std::vector<double> times;
    uint64_t file_bytes = 0, hashed = 0;
    double limit = OpensslSpeed(threads, openssl_seconds);
    for (int r = 0; r < repeats + 1; ++r) {  // run 0 warms the page cache
      auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<Fingerprint> fp = FingerprintTree(root, o, NoProgress());
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!fp.ok()) {
        std::fprintf(stderr, "%s\n", std::string(fp.status().message()).c_str());
        return 2;
      }
      if (r > 0) times.push_back(s);
      hashed = fp->hashed_bytes;
      file_bytes = 0;
      for (const FileFingerprint& f : fp->files) file_bytes += f.size;
    }
    std::sort(times.begin(), times.end());
    double secs = times[times.size() / 2];
    double ckpt_rate = file_bytes / secs, sha_rate = hashed / secs;
    std::printf("%-44s %8.3f %9.0f %9.0f %9.0f %8.3f %8.3f\n", v.name, secs, ckpt_rate / 1e6,
                sha_rate / 1e6, limit / 1e6, ckpt_rate / limit, sha_rate / limit);
    std::fflush(stdout);
  }
  std::printf("load average at end: %s", LoadAverage().c_str());
  if (!keep) fs::remove_all(dir);
  return 0;
}
