#include "bench/scale/scale_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/parallel.h"
#include "core/quant/codecs.h"
#include "core/quant/quant_weight.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/scale_window.h"
#include "core/quant/transcode.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Counter-based random stream: word n of stream `key` is SplitMix64's output for state
// key + (n + 1) * gamma, so any range is generated independently of any other.
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t Word(uint64_t key, uint64_t n) { return Mix64(key + (n + 1) * kGamma); }

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
uint64_t KeyOf(uint64_t seed, const std::string& name, std::string_view role) {
  return Mix64(Mix64(seed) ^ Fnv1a(name) ^ Mix64(Fnv1a(role)));
}

constexpr uint64_t kPieceBytes = 32ull << 20;  // one pwrite

// One MXFP4 matrix, or gpt-oss's stack of E matrices, seen as [rows, cols] codes.
struct Fp4Module {
  uint64_t rows = 0, cols = 0;
  uint64_t packed_key = 0, scale_key = 0, row_key = 0, zero_key = 0;
  int top = 0;  // k_max of the fused group: exponent of group (0, 0), the largest

  uint64_t groups() const { return cols / 32; }
  bool Zero(uint64_t r, uint64_t g) const {
    return (r | g) != 0 && Word(zero_key, r * groups() + g) % 1024 == 0;
  }
  int Exponent(uint64_t r, uint64_t g) const {
    if ((r | g) == 0) return top;
    return top - static_cast<int>(Word(row_key, r) % 5) -
           static_cast<int>(Word(scale_key, r * groups() + g) % 8);
  }
  uint8_t MxScale(uint64_t r, uint64_t g) const {
    if (Zero(r, g)) return (Word(zero_key, r * groups() + g) >> 32) & 1 ? 1 : 250;
    return static_cast<uint8_t>(127 + Exponent(r, g));
  }
};

enum class Fill { kDense, kPacked, kMxScale, kNvScale, kGlobalScale };

struct PlannedTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  Fill fill = Fill::kDense;
  uint64_t key = 0;                    // kDense
  float offset = 0, amplitude = 0;     // kDense: offset + amplitude * U(-1, 1)
  std::shared_ptr<const Fp4Module> m;  // the FP4 fills

  uint64_t Bytes() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n * DTypeBits(dtype) / 8;
  }
  // Rows for cutting into pieces: the first dimension(s), all but the row's own bytes.
  uint64_t Rows() const {
    if (fill == Fill::kPacked || fill == Fill::kMxScale || fill == Fill::kNvScale) return m->rows;
    return shape.size() >= 2 ? shape[0] : 1;
  }
};

void FillRows(const PlannedTensor& t, uint64_t r0, uint64_t r1, uint8_t* out) {
  const uint64_t row_bytes = t.Bytes() / t.Rows();
  switch (t.fill) {
    case Fill::kDense: {
      const uint64_t per_row = row_bytes * 8 / DTypeBits(t.dtype);
      for (uint64_t i = r0 * per_row; i < r1 * per_row; ++i) {
        const double u = static_cast<double>(Word(t.key, i) >> 40) * 0x1p-23 - 1.0;
        const float v = t.offset + t.amplitude * static_cast<float>(u);
        if (t.dtype == DType::kF32) {
          std::memcpy(out, &v, 4);
          out += 4;
        } else {
          const uint16_t b = quant::EncodeBF16(v);
          std::memcpy(out, &b, 2);
          out += 2;
        }
      }
      return;
    }
    case Fill::kPacked: {
      const Fp4Module& m = *t.m;
      for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t g = 0; g < m.groups(); ++g, out += 16) {
          if (m.Zero(r, g)) {
            std::memset(out, 0, 16);
            continue;
          }
          uint64_t w[2] = {Word(m.packed_key, 2 * (r * m.groups() + g)),
                           Word(m.packed_key, 2 * (r * m.groups() + g) + 1)};
          if (((w[0] | w[1]) & 0x7777777777777777ull) == 0) w[0] |= 1;  // keep it active
          std::memcpy(out, w, 16);
        }
      }
      return;
    }
    case Fill::kMxScale:
      for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t g = 0; g < t.m->groups(); ++g) *out++ = t.m->MxScale(r, g);
      }
      return;
    case Fill::kNvScale: {
      // docs/quant.md, "Transcoding MXFP4 -> NVFP4A16": E4M3 2^(k_j - k_max + 8) for both
      // 16-blocks of an active group, +0 for an all-zero group.
      const Fp4Module& m = *t.m;
      for (uint64_t r = r0; r < r1; ++r) {
        for (uint64_t g = 0; g < m.groups(); ++g, out += 2) {
          const uint8_t e = m.Zero(r, g) ? 0
              : static_cast<uint8_t>(quant::EncodeE4M3PowerOfTwo(m.Exponent(r, g) - m.top + 8));
          out[0] = out[1] = e;
        }
      }
      return;
    }
    case Fill::kGlobalScale: {
      const float g = std::ldexp(1.0f, 8 - t.m->top);
      std::memcpy(out, &g, 4);
      return;
    }
  }
}

// The tensors of the source (MXFP4) tree in write order, each with what replaces it in the
// derived tree. Like transcode, the derived scales go into the shard of the packed tensor.
struct SourceTensor {
  PlannedTensor source;
  bool copied = true;                  // NVFP4: the tensor is kept as it is
  std::vector<PlannedTensor> derived;  // else these replace it (none for an MXFP4 scale)
};

class Planner {
 public:
  explicit Planner(uint64_t seed) : seed_(seed) {}

  void Dense(const std::string& name, DType dtype, std::vector<uint64_t> shape, float offset,
             float amplitude) {
    PlannedTensor t{name, dtype, std::move(shape), Fill::kDense, KeyOf(seed_, name, "dense"),
                    offset, amplitude, nullptr};
    out_.push_back({std::move(t), true, {}});
  }
  // A weight with fan-in `in`: values in +-1/sqrt(in).
  void Weight(const std::string& name, DType dtype, uint64_t rows, uint64_t in) {
    Dense(name, dtype, {rows, in}, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  }
  void Norm(const std::string& name, uint64_t n) {
    Dense(name, DType::kBF16, {n}, 1.0f, 0.05f);
  }

  // A compressed-tensors MXFP4 module `base` [rows, cols]: weight_packed, weight_scale.
  void CompressedFp4(const std::string& base, uint64_t rows, uint64_t cols) {
    auto m = Module(base, rows, cols);
    PlannedTensor packed{base + quant::kPackedSuffix, DType::kU8, {rows, cols / 2},
                         Fill::kPacked, 0, 0, 0, m};
    PlannedTensor scale{base + quant::kScaleSuffix, DType::kU8, {rows, cols / 32},
                        Fill::kMxScale, 0, 0, 0, m};
    PlannedTensor nv{base + quant::kScaleSuffix, DType::kF8_E4M3, {rows, cols / 16},
                     Fill::kNvScale, 0, 0, 0, m};
    PlannedTensor global{base + quant::kGlobalScaleSuffix, DType::kF32, {1},
                         Fill::kGlobalScale, 0, 0, 0, m};
    out_.push_back({packed, false, {packed, std::move(nv), std::move(global)}});
    out_.push_back({std::move(scale), false, {}});
  }

  // gpt-oss `base`_blocks [E, rows, cols/32, 16] and `base`_scales [E, rows, cols/32].
  void GptOssFp4(const std::string& base, uint64_t experts, uint64_t rows, uint64_t cols) {
    auto m = Module(base, experts * rows, cols);
    out_.push_back({{base + "_blocks", DType::kU8, {experts, rows, cols / 32, 16}, Fill::kPacked,
                     0, 0, 0, m}, true, {}});
    out_.push_back({{base + "_scales", DType::kU8, {experts, rows, cols / 32}, Fill::kMxScale,
                     0, 0, 0, m}, true, {}});
  }

  std::vector<SourceTensor> Take() { return std::move(out_); }

 private:
  std::shared_ptr<const Fp4Module> Module(const std::string& base, uint64_t rows, uint64_t cols) {
    auto m = std::make_shared<Fp4Module>();
    m->rows = rows;
    m->cols = cols;
    m->packed_key = KeyOf(seed_, base, "packed");
    m->scale_key = KeyOf(seed_, base, "scale");
    m->row_key = KeyOf(seed_, base, "row");
    m->zero_key = KeyOf(seed_, base, "zero");
    // One top exponent per fused group (w1/w3, gate/up share it), in [-8, -3].
    m->top = -3 - static_cast<int>(Word(KeyOf(seed_, quant::FusedGroupOf(base), "top"), 0) % 6);
    return m;
  }

  uint64_t seed_;
  std::vector<SourceTensor> out_;
};

std::vector<SourceTensor> PlanTensors(const ScaleOptions& o) {
  const Geometry& g = o.geometry;
  const uint64_t H = g.hidden, E = g.experts, I = g.intermediate, S = g.shared_intermediate;
  Planner p(o.seed);
  const bool kimi = g.family == ScaleFamily::kKimiK3;
  const std::string root = kimi ? "language_model." : "";
  if (g.vocab) p.Weight(root + "model.embed_tokens.weight", DType::kBF16, g.vocab, H);
  for (int l = 0; l < o.layers; ++l) {
    const std::string layer = absl::StrCat(root, "model.layers.", l, ".");
    p.Norm(layer + "input_layernorm.weight", H);
    p.Norm(layer + "post_attention_layernorm.weight", H);
    if (g.family == ScaleFamily::kGptOss) {
      const std::string mlp = layer + "mlp.";
      p.Weight(mlp + "router.weight", DType::kBF16, E, H);
      p.Dense(mlp + "router.bias", DType::kBF16, {E}, 0.0f, 0.01f);
      p.GptOssFp4(mlp + "experts.gate_up_proj", E, 2 * I, H);
      p.Dense(mlp + "experts.gate_up_proj_bias", DType::kBF16, {E, 2 * I}, 0.0f, 0.01f);
      p.GptOssFp4(mlp + "experts.down_proj", E, H, I);
      p.Dense(mlp + "experts.down_proj_bias", DType::kBF16, {E, H}, 0.0f, 0.01f);
      continue;
    }
    const std::string moe = layer + (kimi ? "block_sparse_moe." : "mlp.");
    p.Weight(moe + "gate.weight", kimi ? DType::kF32 : DType::kBF16, E, H);
    p.Dense(moe + "gate.e_score_correction_bias", DType::kF32, {E}, 0.0f, 0.01f);
    const uint64_t in = kimi ? g.latent : H;
    if (kimi) {
      p.Weight(moe + "routed_expert_down_proj.weight", DType::kBF16, g.latent, H);
      p.Weight(moe + "routed_expert_up_proj.weight", DType::kBF16, H, g.latent);
      p.Norm(moe + "routed_expert_norm.weight", g.latent);
    }
    if (S) {
      p.Weight(moe + "shared_experts.gate_proj.weight", DType::kBF16, S, H);
      p.Weight(moe + "shared_experts.up_proj.weight", DType::kBF16, S, H);
      p.Weight(moe + "shared_experts.down_proj.weight", DType::kBF16, H, S);
    }
    for (uint64_t e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(moe, "experts.", e, ".");
      p.CompressedFp4(x + (kimi ? "w1" : "gate_proj"), I, in);
      p.CompressedFp4(x + (kimi ? "w3" : "up_proj"), I, in);
      p.CompressedFp4(x + (kimi ? "w2" : "down_proj"), in, I);
    }
  }
  if (g.vocab) {
    p.Norm(root + "model.norm.weight", H);
    p.Weight(root + "lm_head.weight", DType::kBF16, g.vocab, H);
  }
  return p.Take();
}

json QuantizationConfig(const Geometry& g) {
  if (g.family == ScaleFamily::kGptOss) {
    return {{"quant_method", "mxfp4"},
            {"modules_to_not_convert",
             {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
              "lm_head"}}};
  }
  const bool kimi = g.family == ScaleFamily::kKimiK3;
  const json weights = {{"dynamic", false}, {"group_size", 32}, {"num_bits", 4},
                        {"strategy", "group"}, {"symmetric", true}, {"type", "float"}};
  const json ignore = kimi ? json{"re:.*self_attn.*", "re:.*shared_experts.*",
                                  "re:.*routed_expert_.*", "re:.*gate$", "re:.*mlp\\..*",
                                  "language_model.lm_head"}
                           : json{"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.gate$",
                                  "lm_head"};
  const std::string target = kimi ? R"(re:.*block_sparse_moe\.experts\.\d+\.w[123]$)"
                                  : R"(re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$)";
  return {{"config_groups",
           {{"group_0",
             {{"input_activations", nullptr},
              {"output_activations", nullptr},
              {"targets", {target}},
              {"weights", weights}}}}},
          {"format", "mxfp4-pack-quantized"},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"}};
}

// config.json of the source; the derived one is what transcode makes of it.
json SourceConfig(const ScaleOptions& o) {
  const Geometry& g = o.geometry;
  const json q = QuantizationConfig(g);
  if (g.family == ScaleFamily::kGptOss) {
    return {{"architectures", {"GptOssForCausalLM"}},
            {"model_type", "gpt_oss"},
            {"hidden_size", g.hidden},
            {"intermediate_size", g.intermediate},
            {"num_local_experts", g.experts},
            {"num_experts_per_tok", g.top_k},
            {"experts_per_token", g.top_k},
            {"num_hidden_layers", o.layers},
            {"rms_norm_eps", 1e-05},
            {"swiglu_limit", 7.0},
            {"vocab_size", g.vocab},
            {"quantization_config", q},
            {"torch_dtype", "bfloat16"}};
  }
  const bool kimi = g.family == ScaleFamily::kKimiK3;
  json text = {{"model_type", kimi ? "kimi_k3" : "deepseek_v3"},
               {"hidden_size", g.hidden},
               {"moe_intermediate_size", g.intermediate},
               {"n_routed_experts", g.experts},
               {"num_experts_per_tok", g.top_k},
               {"n_group", g.n_group},
               {"topk_group", g.topk_group},
               {"n_shared_experts", g.shared_intermediate ? 1 : 0},
               {"first_k_dense_replace", 0},
               {"num_hidden_layers", o.layers},
               {"norm_topk_prob", true},
               {"routed_scaling_factor", 2.5},
               {"scoring_func", "sigmoid"},
               {"topk_method", "noaux_tc"},
               {"rms_norm_eps", 1e-06},
               {"vocab_size", g.vocab},
               {"quantization_config", q}};
  if (g.shared_intermediate) text["shared_expert_intermediate_size"] = g.shared_intermediate;
  if (!kimi) {
    text["architectures"] = {"DeepseekV3ForCausalLM"};
    text["torch_dtype"] = "bfloat16";
    return text;
  }
  text["moe_latent_size"] = g.latent;
  text["latent_moe_use_norm"] = true;
  text["hidden_act"] = "situ";
  text["situ_beta"] = 4.0;
  text["situ_linear_beta"] = 25.0;
  return {{"architectures", {"KimiK3ForConditionalGeneration"}},
          {"model_type", "kimi_k3"},
          {"quantization_config", q},
          {"text_config", text},
          {"torch_dtype", "bfloat16"}};
}

json DerivedConfig(json c) {
  if (c.contains("quantization_config")) {
    c["quantization_config"] = quant::Nvfp4QuantizationConfig(c["quantization_config"]);
  }
  if (c.contains("text_config") && c["text_config"].contains("quantization_config")) {
    c["text_config"]["quantization_config"] =
        quant::Nvfp4QuantizationConfig(c["text_config"]["quantization_config"]);
  }
  return c;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

absl::Status PWriteFully(int fd, const uint8_t* p, uint64_t n, uint64_t off,
                         const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": write at offset ", off, ": ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// One pwrite: rows [r0, r1) of a tensor, at `offset` in file `file`.
struct Piece {
  size_t file;
  const PlannedTensor* tensor;
  uint64_t r0, r1, offset;
};

}  // namespace

absl::StatusOr<Geometry> GeometryNamed(const std::string& name) {
  Geometry g;
  if (name == "kimi-k3") {
    g = {ScaleFamily::kKimiK3, 7168, 3584, 3072, 896, 16, 1, 1, 6144, 163840};
  } else if (name == "deepseek-v3") {
    g = {ScaleFamily::kDeepSeekV3, 7168, 0, 2048, 256, 8, 8, 4, 2048, 129280};
  } else if (name == "gpt-oss-120b") {
    g = {ScaleFamily::kGptOss, 2880, 0, 2880, 128, 4, 1, 1, 0, 201088};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry '", name, "': expected kimi-k3, deepseek-v3 or gpt-oss-120b"));
  }
  return g;
}

absl::Status CheckGeometry(const Geometry& g) {
  const bool kimi = g.family == ScaleFamily::kKimiK3;
  if (g.hidden == 0 || g.hidden % 32 || g.intermediate == 0 || g.intermediate % 32 ||
      (kimi && (g.latent == 0 || g.latent % 32)) || (!kimi && g.latent != 0)) {
    return absl::InvalidArgumentError(
        "hidden, intermediate (and latent, Kimi-K3 only) must be nonzero multiples of 32");
  }
  if (g.experts == 0 || g.top_k == 0 || g.n_group == 0 || g.experts % g.n_group ||
      g.topk_group == 0 || g.topk_group > g.n_group ||
      g.top_k > g.topk_group * (g.experts / g.n_group)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "experts ", g.experts, ", top-k ", g.top_k, ", groups ", g.n_group, "/", g.topk_group,
        ": top-k must fit in the selected groups"));
  }
  if (g.family == ScaleFamily::kGptOss && g.shared_intermediate) {
    return absl::InvalidArgumentError("gpt-oss has no shared expert");
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorOrder> TensorOrderNamed(const std::string& name) {
  if (name == "sorted") return TensorOrder::kSorted;
  if (name == "model") return TensorOrder::kModel;
  if (name == "reverse") return TensorOrder::kReverse;
  if (name == "shuffle") return TensorOrder::kShuffle;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tensor order '", name, "' (sorted, model, reverse, shuffle)"));
}

namespace {

// Fisher-Yates with the rig's own hash as the source of randomness, so that the same seed
// gives the same order on every platform.
template <typename T>
void Shuffle(std::vector<T>& v, uint64_t key) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Word(key, i) % i]);
}

}  // namespace

absl::StatusOr<ScaleResult> WriteScaleCheckpoint(const std::string& dir,
                                                 const ScaleOptions& o) {
  if (absl::Status s = CheckGeometry(o.geometry); !s.ok()) return s;
  const bool nvfp4 = o.format == ScaleFormat::kNvfp4;
  if (nvfp4 && o.geometry.family == ScaleFamily::kGptOss) {
    return absl::InvalidArgumentError(
        "NVFP4 output needs a compressed-tensors geometry, not gpt-oss");
  }
  if (o.layers < 1 || o.shard_bytes == 0) {
    return absl::InvalidArgumentError("layers and shard size must be positive");
  }
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  if (!fs::create_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": cannot create (it must not exist): ", ec ? ec.message() : "exists"));
  }
  std::vector<SourceTensor> plan = PlanTensors(o);
  if (o.order == TensorOrder::kShuffle) Shuffle(plan, KeyOf(o.seed, "order", "shuffle"));

  // Shards: whole source tensors, greedily up to shard_bytes each (the derived tree keeps the
  // source's partition, as transcode does).
  std::vector<std::vector<const SourceTensor*>> shards(1);
  uint64_t filled = 0;
  for (const SourceTensor& t : plan) {
    if (filled > 0 && filled + t.source.Bytes() > o.shard_bytes) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(&t);
    filled += t.source.Bytes();
  }

  ScaleResult result;
  json weight_map = json::object();
  uint64_t total_size = 0;
  std::vector<std::string> paths;
  std::vector<int> fds;
  std::vector<Piece> pieces;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    std::vector<const PlannedTensor*> tensors;
    for (const SourceTensor* t : shards[i]) {
      if (nvfp4 && !t->copied) {
        for (const PlannedTensor& d : t->derived) tensors.push_back(&d);
      } else {
        tensors.push_back(&t->source);
      }
    }
    if (o.order == TensorOrder::kReverse) std::reverse(tensors.begin(), tensors.end());
    if (o.order == TensorOrder::kShuffle) {
      // From the names in name order, so that the order depends only on the seed.
      std::sort(tensors.begin(), tensors.end(),
                [](const PlannedTensor* a, const PlannedTensor* b) { return a->name < b->name; });
      Shuffle(tensors, KeyOf(o.seed, absl::StrCat("shard-", i), "shuffle"));
    }
    std::vector<quant::TensorEntry> entries;
    std::map<std::string, const PlannedTensor*> by_name;
    for (const PlannedTensor* t : tensors) {
      entries.push_back({t->name, t->dtype, t->shape});
      by_name[t->name] = t;
      weight_map[t->name] = name;
    }
    const std::string path = (fs::path(dir) / name).string();
    absl::StatusOr<quant::SafetensorsLayout> layout =
        quant::LayOutSafetensors(path, std::move(entries), {{"format", "pt"}},
                                 o.order == TensorOrder::kSorted ? quant::TensorOrder::kReference
                                                                 : quant::TensorOrder::kAsGiven);
    if (!layout.ok()) {
      close_all();
      return layout.status();
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      close_all();
      return absl::DataLossError(absl::StrCat(path, ": open: ", std::strerror(errno)));
    }
    fds.push_back(fd);
    paths.push_back(path);
    for (size_t k = 0; k < layout->tensors.size(); ++k) {
      const PlannedTensor* t = by_name.at(layout->tensors[k].name);
      const uint64_t size = layout->sizes[k];
      const uint64_t rows = t->Rows(), row_bytes = size / rows;
      const uint64_t step = std::max<uint64_t>(1, kPieceBytes / std::max<uint64_t>(row_bytes, 1));
      for (uint64_t r = 0; r < rows; r += step) {
        pieces.push_back({i, t, r, std::min(rows, r + step), layout->offsets[k] + r * row_bytes});
      }
      total_size += size;
      ++result.tensors;
    }
    const uint64_t end = layout->file_size;
    absl::Status st = PWriteFully(fd, layout->prefix.data(), layout->prefix.size(), 0, path);
    if (st.ok() && ::ftruncate(fd, static_cast<off_t>(end)) != 0) {
      st = absl::DataLossError(absl::StrCat(path, ": ftruncate: ", std::strerror(errno)));
    }
    if (!st.ok()) {
      close_all();
      return st;
    }
    result.bytes += end;
  }

  absl::Status st = ParallelFor(pieces.size(), o.threads, [&](size_t i) {
    thread_local std::vector<uint8_t> buf;
    const Piece& p = pieces[i];
    const uint64_t n = p.tensor->Bytes() / p.tensor->Rows() * (p.r1 - p.r0);
    buf.resize(n);
    FillRows(*p.tensor, p.r0, p.r1, buf.data());
    return PWriteFully(fds[p.file], buf.data(), n, p.offset, paths[p.file]);
  });
  if (st.ok()) {
    st = ParallelFor(fds.size(), o.threads, [&](size_t i) {
      if (::fsync(fds[i]) != 0) {
        return absl::DataLossError(absl::StrCat(paths[i], ": fsync: ", std::strerror(errno)));
      }
      return absl::OkStatus();
    });
  }
  close_all();
  if (!st.ok()) return st;

  const json source_config = SourceConfig(o);
  const std::string config = DumpJson(nvfp4 ? DerivedConfig(source_config) : source_config, 2);
  const std::string index = DumpJson(
      json({{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}}), 2);
  const std::pair<const char*, const std::string*> texts[] = {
      {"config.json", &config}, {"model.safetensors.index.json", &index}};
  for (const auto& [name, text] : texts) {
    if (absl::Status s = WriteText(fs::path(dir) / name, *text); !s.ok()) return s;
    result.bytes += text->size();
  }
  result.files = shards.size() + 2;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace ckpt::bench
