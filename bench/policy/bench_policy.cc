// bench_policy: what the scale-window check and pair verification cost over a plain pass.
//
// Generates a synthetic MXFP4 checkpoint of --size-gib (Kimi-K3 expert geometry: w1/w3
// [3072, 3584], w2 [3584, 3072], 16 experts per layer, one shard per layer; random nibbles,
// per-row scales within an 8-binade span, 0.1% all-zero groups) and its lossless NVFP4
// transcode, then times, on --threads threads, each check against a baseline pass over the same
// bytes in the same run (best of --repeat, run alternately; all data in the page cache):
//   scale-window  vs  a read pass (64-bit XOR of every word) over the source tensors
//   verify-pair   vs  memcmp of every same-named, same-size tensor pair + a read of the rest
//                     (scale tensors differ in size, so each side is read once)
// Target: ratio <= 1.5. Results: docs/PERFORMANCE.md.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "core/checkpoint.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "core/quant/pair_verify.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/scale_window.h"
#include "core/quant/transcode.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kInter = 3072, kLatent = 3584, kExperts = 16;

std::atomic<uint64_t> g_sink{0};

void Die(const absl::Status& s) {
  std::fprintf(stderr, "bench_policy: %s\n", s.ToString().c_str());
  std::exit(2);
}

std::vector<uint8_t> RandomBytes(uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> b(n);
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(&b[i], &w, 8);
  }
  return b;
}

// One MXFP4 matrix: random codes, per-row base exponent in [-8, -4] plus 0..7 per group.
void AddMatrix(const std::string& m, uint64_t rows, uint64_t cols, std::mt19937_64& rng,
               std::vector<TensorToWrite>* out) {
  std::vector<uint8_t> packed = RandomBytes(rows * cols / 2, rng);
  std::vector<uint8_t> scale(rows * cols / 32);
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t base = static_cast<uint8_t>(119 + rng() % 5);
    for (uint64_t g = 0; g < cols / 32; ++g) {
      const uint64_t x = rng();
      scale[r * (cols / 32) + g] = static_cast<uint8_t>(base + x % 8);
      if ((x >> 32) % 1000 == 0) {  // an all-zero group with an out-of-window scale
        std::memset(&packed[r * cols / 2 + g * 16], 0, 16);
        scale[r * (cols / 32) + g] = 1;
      }
    }
  }
  out->push_back(TensorToWrite::Owned(m + ".weight_packed", DType::kU8, {rows, cols / 2},
                                      std::move(packed)));
  out->push_back(TensorToWrite::Owned(m + ".weight_scale", DType::kU8, {rows, cols / 32},
                                      std::move(scale)));
}

void WriteSource(const fs::path& dir, int layers) {
  fs::create_directories(dir);
  json weight_map = json::object();
  uint64_t total = 0;
  std::mt19937_64 rng(42);
  for (int l = 0; l < layers; ++l) {
    std::vector<TensorToWrite> tensors;
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    // A small dense tensor per layer: verified by digest.
    tensors.push_back(TensorToWrite::Owned(prefix + "self_attn.o_proj.weight", DType::kBF16,
                                           {1024, 1024}, RandomBytes(2u << 20, rng)));
    for (uint64_t e = 0; e < kExperts; ++e) {
      const std::string m = prefix + "block_sparse_moe.experts." + std::to_string(e) + ".";
      AddMatrix(m + "w1", kInter, kLatent, rng, &tensors);
      AddMatrix(m + "w2", kLatent, kInter, rng, &tensors);
      AddMatrix(m + "w3", kInter, kLatent, rng, &tensors);
    }
    const std::string shard = "model-" + std::to_string(100001 + l).substr(1) + "-of-" +
                              std::to_string(100000 + layers).substr(1) + ".safetensors";
    for (const TensorToWrite& t : tensors) {
      weight_map[t.name] = shard;
      total += t.data().size();
    }
    if (absl::Status s = WriteSafetensors((dir / shard).string(), std::move(tensors), {{"format", "pt"}});
        !s.ok()) {
      Die(s);
    }
  }
  const json q = {{"quant_method", "compressed-tensors"},
                  {"format", "mxfp4-pack-quantized"},
                  {"ignore", {"re:.*self_attn.*"}},
                  {"config_groups",
                   {{"group_0",
                     {{"targets", {"re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"}},
                      {"input_activations", nullptr},
                      {"weights",
                       {{"num_bits", 4}, {"type", "float"}, {"group_size", 32},
                        {"strategy", "group"}, {"symmetric", true}}}}}}}};
  const json config = {{"model_type", "kimi_k3"},
                       {"quantization_config", q},
                       {"text_config",
                        {{"quantization_config", q},
                         {"moe_intermediate_size", kInter},
                         {"moe_latent_size", kLatent},
                         {"n_routed_experts", kExperts},
                         {"num_hidden_layers", layers}}}};
  std::ofstream(dir / "config.json") << config.dump(2);
  std::ofstream(dir / "model.safetensors.index.json")
      << json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}).dump(2);
}

uint64_t ReadPass(std::span<const uint8_t> b) {
  uint64_t acc = 0, w;
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    std::memcpy(&w, b.data() + i, 8);
    acc ^= w;
  }
  for (; i < b.size(); ++i) acc ^= b[i];
  return acc;
}

double Seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best-of-`repeat` times of a baseline and a check, run alternately so that load from other
// processes hits both alike.
std::pair<double, double> BestOfAlternating(const std::function<void()>& baseline,
                                            const std::function<void()>& check, int repeat) {
  double b = 1e30, c = 1e30;
  for (int i = 0; i < repeat; ++i) {
    b = std::min(b, Seconds(baseline));
    c = std::min(c, Seconds(check));
  }
  return {b, c};
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int Main(int argc, char** argv) {
  CLI::App app{"bench_policy: scale-window and pair-verification cost vs a plain pass"};
  double size_gib = 2.0;
  std::string dir;
  unsigned threads = 0;
  int repeat = 3;
  bool keep = false;
  app.add_option("--size-gib", size_gib, "approximate source size (whole 16-expert layers)");
  app.add_option("--dir", dir, "where to write the pair (default: a new dir under $TMPDIR)");
  app.add_option("--threads", threads, "worker threads (0 = all cores)");
  app.add_option("--repeat", repeat, "timed runs per variant; the best is reported");
  app.add_flag("--keep", keep, "keep the generated pair (a later run with --dir reuses it)");
  CLI11_PARSE(app, argc, argv);
  if (threads == 0) threads = DefaultThreads();
  const uint64_t layer_bytes = kExperts * 3 * (kInter * kLatent / 2 + kInter * kLatent / 32);
  const int layers = std::max(1, static_cast<int>(size_gib * (1ull << 30) / layer_bytes + 0.5));
  fs::path root = dir.empty() ? fs::temp_directory_path() / ("bench-policy-" + std::to_string(::getpid()))
                              : fs::path(dir);
  std::printf("machine: %s, %u hardware threads; using %u threads\n", CpuModel().c_str(),
              DefaultThreads(), threads);

  // A pair kept by an earlier --keep run in --dir is reused as is.
  const bool reuse = fs::exists(root / "src") && fs::exists(root / "nvfp4");
  auto t0 = std::chrono::steady_clock::now();
  if (!reuse) WriteSource(root / "src", layers);
  auto src = Checkpoint::Open((root / "src").string());
  if (!src.ok()) Die(src.status());
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  TranscodeOptions topt;
  topt.threads = threads;
  if (!reuse) {
    auto tr = TranscodeToNvfp4(**src, (root / "nvfp4").string(), topt, NoProgress());
    if (!tr.ok()) Die(tr.status());
  }
  const double transcode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto dst = Checkpoint::Open((root / "nvfp4").string());
  if (!dst.ok()) Die(dst.status());
  const uint64_t src_bytes = (*src)->total_tensor_bytes(), dst_bytes = (*dst)->total_tensor_bytes();
  if (reuse) {
    std::printf("pair (reused): source %.3f GiB, derived %.3f GiB\n", src_bytes / 1073741824.0,
                dst_bytes / 1073741824.0);
  } else {
    std::printf("pair: source %.3f GiB, derived %.3f GiB (generated in %.1f s, transcoded in "
                "%.1f s incl. fsync = %.2f GB/s)\n",
                src_bytes / 1073741824.0, dst_bytes / 1073741824.0, gen_s, transcode_s,
                src_bytes / transcode_s / 1e9);
  }

  const std::vector<std::string> src_names = (*src)->TensorNames();
  const std::vector<std::string> dst_names = (*dst)->TensorNames();
  auto read_source = [&] {
    ParallelFor(src_names.size(), threads, [&](size_t i) {
      g_sink ^= ReadPass((*src)->Find(src_names[i])->bytes());
      return absl::OkStatus();
    }).IgnoreError();
  };
  auto compare_pair = [&] {
    std::vector<std::string> all = src_names;
    all.insert(all.end(), dst_names.begin(), dst_names.end());
    ParallelFor(all.size(), threads, [&](size_t i) {
      const bool from_src = i < src_names.size();
      auto a = (from_src ? *src : *dst)->Find(all[i]);
      auto b = (from_src ? *dst : *src)->Find(all[i]);
      if (b && a->bytes().size() == b->bytes().size()) {
        if (from_src) {
          g_sink += std::memcmp(a->bytes().data(), b->bytes().data(), a->bytes().size()) == 0;
        }
      } else {
        g_sink ^= ReadPass(a->bytes());  // one side only, or different sizes: read each once
      }
      return absl::OkStatus();
    }).IgnoreError();
  };
  // Warm the page cache with both checkpoints.
  compare_pair();
  read_source();

  ScaleWindowPolicy policy;
  absl::StatusOr<ScaleWindowResult> sw;
  const auto [base_sw, t_sw] = BestOfAlternating(
      read_source, [&] { sw = policy.Check(**src, NoProgress(), threads); }, repeat);
  if (!sw.ok()) Die(sw.status());
  PairVerifyOptions popt;
  popt.threads = threads;
  absl::StatusOr<PairVerifyResult> pv;
  const auto [base_pair, t_pair] = BestOfAlternating(
      compare_pair, [&] { pv = VerifyPair(**src, **dst, popt, NoProgress()); }, repeat);
  if (!pv.ok()) Die(pv.status());

  // Format detection (config patterns, inventory): serial work inside VerifyPair.
  const double t_detect = Seconds([&] {
    g_sink += DetectFormat(**src).findings.total() + DetectFormat(**dst).findings.total();
  });
  std::printf("format detection of both sides, one after the other: %.3f s (verify-pair runs the two side by side)\n", t_detect);
  std::printf("scale-window: verdict %s; %.3f s vs read pass %.3f s (%.2f GB/s vs %.2f GB/s): "
              "ratio %.2f\n",
              VerdictName(sw->verdict).c_str(), t_sw, base_sw, src_bytes / t_sw / 1e9,
              src_bytes / base_sw / 1e9, t_sw / base_sw);
  std::printf("verify-pair:  verdict %s; %.3f s vs memcmp pass %.3f s (%.2f GB/s vs %.2f GB/s "
              "of source+derived): ratio %.2f\n",
              pv->verdict().c_str(), t_pair, base_pair, (src_bytes + dst_bytes) / t_pair / 1e9,
              (src_bytes + dst_bytes) / base_pair / 1e9, t_pair / base_pair);
  if (!keep && !reuse) fs::remove_all(root);
  return sw->verdict == ScaleWindowVerdict::kLosslessTranscodable && pv->lossless ? 0 : 1;
}

}  // namespace ckpt::quant

int main(int argc, char** argv) { return ckpt::quant::Main(argc, argv); }
