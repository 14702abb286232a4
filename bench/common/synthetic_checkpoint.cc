#include "bench/common/synthetic_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/quant/safetensors_writer.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kInter = 3072, kLatent = 3584, kExperts = 16;

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
               std::vector<quant::TensorToWrite>* out) {
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
  out->push_back(quant::TensorToWrite::Owned(m + ".weight_packed", DType::kU8, {rows, cols / 2},
                                      std::move(packed)));
  out->push_back(quant::TensorToWrite::Owned(m + ".weight_scale", DType::kU8, {rows, cols / 32},
                                      std::move(scale)));
}

}  // namespace

absl::Status WriteSyntheticSource(const fs::path& dir, int layers) {
  fs::create_directories(dir);
  json weight_map = json::object();
  uint64_t total = 0;
  std::mt19937_64 rng(42);
  for (int l = 0; l < layers; ++l) {
    std::vector<quant::TensorToWrite> tensors;
    const std::string prefix = "model.layers." + std::to_string(l) + ".";
    // A small dense tensor per layer: verified by digest.
    tensors.push_back(quant::TensorToWrite::Owned(prefix + "self_attn.o_proj.weight", DType::kBF16,
                                           {1024, 1024}, RandomBytes(2u << 20, rng)));
    for (uint64_t e = 0; e < kExperts; ++e) {
      const std::string m = prefix + "block_sparse_moe.experts." + std::to_string(e) + ".";
      AddMatrix(m + "w1", kInter, kLatent, rng, &tensors);
      AddMatrix(m + "w2", kLatent, kInter, rng, &tensors);
      AddMatrix(m + "w3", kInter, kLatent, rng, &tensors);
    }
    const std::string shard = "model-" + std::to_string(100001 + l).substr(1) + "-of-" +
                              std::to_string(100000 + layers).substr(1) + ".safetensors";
    for (const quant::TensorToWrite& t : tensors) {
      weight_map[t.name] = shard;
      total += t.data().size();
    }
    if (absl::Status s = quant::WriteSafetensors((dir / shard).string(), std::move(tensors),
                                                 {{"format", "pt"}});
        !s.ok()) {
      return s;
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
  std::ofstream(dir / "config.json") << DumpJson(config, 2);
  std::ofstream(dir / "model.safetensors.index.json")
      << DumpJson(json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}), 2);
  return absl::OkStatus();
}

int LayersFor(double size_gib) {
  const uint64_t layer_bytes = kExperts * 3 * (kInter * kLatent / 2 + kInter * kLatent / 32);
  return std::max(1, static_cast<int>(size_gib * (1ull << 30) / layer_bytes + 0.5));
}

}  // namespace ckpt::bench
