#include "tests/quant/gpt_oss_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint.h"
#include "core/quant/codecs.h"
#include "core/quant/fp4_tensor.h"
#include "core/quant/gpt_oss_cast.h"
#include "core/quant/safetensors_writer.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant::testing {
namespace {

namespace fs = std::filesystem;
using gptoss::Dims;
using gptoss::Fused;
using nlohmann::json;

uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t Hash(uint64_t seed, std::initializer_list<uint64_t> xs) {
  uint64_t h = Mix(seed);
  for (uint64_t x : xs) h = Mix(h ^ x);
  return h;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::create_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": cannot create (it must not exist)"));
  }
  return absl::OkStatus();
}

// BF16 values offset + amplitude * U(-1, 1) from (seed, name).
TensorToWrite Dense(uint64_t seed, const std::string& name, std::vector<uint64_t> shape,
                    float offset, float amplitude) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<uint8_t> bytes(2 * n);
  uint64_t name_key = Mix(seed);
  for (unsigned char c : name) name_key = Mix(name_key ^ c);
  for (uint64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(Hash(name_key, {i}) >> 40) * 0x1p-23 - 1.0;
    const uint16_t b = EncodeBF16(offset + amplitude * static_cast<float>(u));
    std::memcpy(&bytes[2 * i], &b, 2);
  }
  return TensorToWrite::Owned(name, DType::kBF16, std::move(shape), std::move(bytes));
}

// What one 32-group of a fixture expert tensor holds.
struct Group {
  bool zero = false;  // all codes +0/-0
  uint8_t scale = 0;  // E8M0 byte
  uint8_t fill = 0;   // the byte of every code pair of a zero group
};

// The special all-zero groups (FIXTURES.md): odd experts, rows 3-6.
Group GroupAt(const GptOssFixtureSpec& s, int layer, Fused f, uint64_t e, uint64_t r, uint64_t g,
              int top) {
  const uint64_t R = s.dims.Rows(f), G = s.dims.Cols(f) / 32, E = s.dims.experts;
  const bool clean = layer == s.layers - 1 && f == Fused::kDown;
  const uint8_t in_window = static_cast<uint8_t>(127 + top - 2);
  if (e % 2 == 1) {
    if (r == 3 && g == 0) return {true, clean ? in_window : uint8_t{250}, 0x00};
    if (r == 4 && g == G - 1) return {true, clean ? uint8_t{0} : uint8_t{1}, 0x88};
    if (r == 5 && g == 0) return {true, 0, 0x00};
    if (r == 6 && g == 0) return {true, in_window, 0x08};
  }
  const uint64_t h =
      Hash(s.seed, {static_cast<uint64_t>(layer), static_cast<uint64_t>(f), e, r, g});
  int k = top - static_cast<int>(h % 15);
  if ((e | r | g) == 0) k = top;
  if (e == E - 1 && r == R - 1 && g == G - 1) k = top - 17;
  return {false, static_cast<uint8_t>(127 + k), 0};
}

void FillExperts(const GptOssFixtureSpec& s, int layer, Fused f, const std::string& prefix,
                 std::vector<TensorToWrite>* out) {
  const Dims& d = s.dims;
  const uint64_t R = d.Rows(f), C = d.Cols(f), G = C / 32, E = d.experts;
  const int top = -4 - layer - (f == Fused::kDown ? 1 : 0);
  std::vector<uint8_t> blocks(E * R * C / 2), scales(E * R * G);
  for (uint64_t e = 0; e < E; ++e) {
    for (uint64_t r = 0; r < R; ++r) {
      for (uint64_t g = 0; g < G; ++g) {
        const Group grp = GroupAt(s, layer, f, e, r, g, top);
        // Position of the group's first code through the layout module.
        const uint64_t at = gptoss::Mxfp4Position(d, f, {e, r, g * 32}).code.byte;
        scales[gptoss::Mxfp4Position(d, f, {e, r, g * 32}).scale] = grp.scale;
        for (uint64_t i = 0; i < 16; ++i) {
          blocks[at + i] =
              grp.zero ? grp.fill
                       : static_cast<uint8_t>(Hash(s.seed, {9, static_cast<uint64_t>(layer),
                                                            static_cast<uint64_t>(f), e, r, g, i}));
        }
        if (!grp.zero) blocks[at] |= 0x07;  // keep it active, and every max nibble 6
      }
    }
  }
  const std::vector<gptoss::TensorSpec> specs = gptoss::Mxfp4Tensors(prefix, d, f, DType::kBF16);
  out->push_back(TensorToWrite::Owned(specs[0].name, specs[0].dtype, specs[0].shape, blocks));
  out->push_back(TensorToWrite::Owned(specs[1].name, specs[1].dtype, specs[1].shape, scales));
  out->push_back(Dense(s.seed, specs[2].name, specs[2].shape, 0.0f, 0.01f));
}

json Mxfp4Config(const GptOssFixtureSpec& s) {
  json layer_types = json::array();
  for (int l = 0; l < s.layers; ++l) {
    layer_types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  return {{"architectures", {"GptOssForCausalLM"}},
          {"model_type", "gpt_oss"},
          {"hidden_size", s.dims.hidden},
          {"intermediate_size", s.dims.intermediate},
          {"num_local_experts", s.dims.experts},
          {"num_experts_per_tok", s.top_k},
          {"experts_per_token", s.top_k},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"attention_bias", true},
          {"attention_dropout", 0.0},
          {"hidden_act", "silu"},
          {"layer_types", layer_types},
          {"sliding_window", 128},
          {"max_position_embeddings", 4096},
          {"rope_theta", 150000},
          {"rms_norm_eps", 1e-05},
          {"swiglu_limit", 7.0},
          {"tie_word_embeddings", false},
          {"vocab_size", s.vocab},
          {"torch_dtype", "bfloat16"},
          {"quantization_config",
           {{"quant_method", "mxfp4"},
            {"modules_to_not_convert",
             {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
              "lm_head"}}}}};
}

// Nearest E4M3FN byte to a positive v (ties to the even byte); v is clamped to [2^-9, 448].
uint8_t RoundE4M3(double v) {
  v = std::clamp(v, std::ldexp(1.0, -9), 448.0);
  int best = 1;
  for (int b = 1; b < 0x7F; ++b) {
    const double e = std::fabs(DecodeE4M3(b) - v), eb = std::fabs(DecodeE4M3(best) - v);
    if (e < eb || (e == eb && b % 2 == 0)) best = b;
  }
  return static_cast<uint8_t>(best);
}

// Nearest E2M1 code to v, the sign kept (ties to the even magnitude index).
uint8_t RoundE2M1(double v) {
  const double a = std::fabs(v);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double e = std::fabs(kE2M1Magnitude[i] - a), eb = std::fabs(kE2M1Magnitude[best] - a);
    if (e < eb || (e == eb && i % 2 == 0)) best = i;
  }
  return static_cast<uint8_t>(best | (std::signbit(v) ? 8 : 0));
}

json ModelOptQuantConfig() {
  const json fp4 = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  return {{"config_groups",
           {{"group_0", {{"input_activations", fp4}, {"weights", fp4}, {"targets", {"Linear"}}}}}},
          {"ignore",
           {"lm_head", "model.embed_tokens", "model.layers.*.self_attn*",
            "model.layers.*.mlp.router*"}},
          {"quant_algo", "NVFP4"},
          {"producer", {{"name", "modelopt"}, {"version", "0.0.0+ckpt-audit-fixture"}}},
          {"quant_method", "modelopt"}};
}

// Our model of ModelOpt's closed-form cast of one stacked tensor (FIXTURES.md): k_max over
// every nonzero scale byte; in-window blocks (and byte 0) get 2^(k_j - m); the others a
// data-derived scale max_nibble * 2^(k_j - m) / 6 clamped to [2^-9, 448] (a zero one becomes
// 1), and their codes requantized to it.
gptoss::ModelOptFused ModelOptRuleCast(const Mxfp4View& v, const Dims& d, Fused f) {
  const uint64_t E = d.experts, R = d.Rows(f), C = d.Cols(f), G = C / 32;
  std::optional<int> k_max;
  for (uint64_t r = 0; r < E * R; ++r) {
    for (uint64_t g = 0; g < G; ++g) {
      if (v.ScaleByte(r, g) > 0)
        k_max = std::max(k_max.value_or(-1000), E8M0Exponent(v.ScaleByte(r, g)));
    }
  }
  const int m = k_max.value_or(8) - 8;
  gptoss::ModelOptFused out;
  out.weight_scale_2 = std::ldexp(1.0f, m);
  out.packed.assign(E * R * C / 2, 0);
  out.scales.assign(E * R * C / 16, 0);
  for (uint64_t e = 0; e < E; ++e) {
    for (uint64_t r = 0; r < R; ++r) {
      for (uint64_t blk = 0; blk < C / 16; ++blk) {
        const uint64_t row = e * R + r;
        const uint8_t s = v.ScaleByte(row, blk / 2);
        const int k = E8M0Exponent(s);
        const bool in_range = s == 0 || (k - m >= -9 && k - m <= 8);
        uint8_t max_idx = 0;
        for (uint64_t c = blk * 16; c < blk * 16 + 16; ++c) {
          max_idx = std::max<uint8_t>(max_idx, v.codes().Code(row, c) & 7);
        }
        const double amax = (in_range ? 6.0 : kE2M1Magnitude[max_idx]) * std::ldexp(1.0, k);
        const double per_block = amax / 6.0 / std::ldexp(1.0, m);
        const uint8_t scale = RoundE4M3(per_block == 0 ? 1.0 : per_block);
        out.scales[gptoss::ModelOptPosition(d, f, {e, r, blk * 16}).scale] = scale;
        for (uint64_t c = blk * 16; c < blk * 16 + 16; ++c) {
          const double x = DecodeE2M1(v.codes().Code(row, c)) * std::ldexp(1.0, k);
          const uint8_t code = RoundE2M1(x / (DecodeE4M3(scale) * std::ldexp(1.0, m)));
          const gptoss::NibbleAt at = gptoss::ModelOptPosition(d, f, {e, r, c}).code;
          out.packed[at.byte] |= static_cast<uint8_t>(at.high ? code << 4 : code);
        }
      }
    }
  }
  return out;
}

// One stacked tensor of the source, exported: the lossless cast is core's.
absl::Status ExportFused(const Checkpoint& src, const Dims& d, const std::string& base, Fused f,
                         ModelOptCast cast, std::vector<TensorToWrite>* out) {
  const std::optional<TensorRef> b = src.Find(base + "_blocks"), sc = src.Find(base + "_scales");
  if (!b || !sc) return absl::InvalidArgumentError(base + ": blocks or scales missing");
  absl::StatusOr<gptoss::ModelOptFused> x;
  if (cast == ModelOptCast::kLossless) {
    x = gptoss::CastToModelOpt(base, d, f, b->bytes(), sc->bytes());
  } else {
    absl::StatusOr<Mxfp4View> v =
        Mxfp4View::Make(base, b->bytes(), sc->bytes(), d.experts * d.Rows(f), d.Cols(f));
    if (!v.ok()) return v.status();
    x = ModelOptRuleCast(*v, d, f);
  }
  if (!x.ok()) return x.status();
  const float input = 1.0f;
  std::vector<uint8_t> s2b(4), inb(4);
  std::memcpy(s2b.data(), &x->weight_scale_2, 4);
  std::memcpy(inb.data(), &input, 4);
  const std::vector<gptoss::TensorSpec> specs = gptoss::ModelOptTensors(
      base.substr(0, base.size() - gptoss::FusedName(f).size()), d, f, true, DType::kBF16);
  std::vector<uint8_t>* data[] = {&x->packed, &x->scales, &s2b, &inb};
  for (int i = 0; i < 4; ++i) {
    out->push_back(
        TensorToWrite::Owned(specs[i].name, specs[i].dtype, specs[i].shape, std::move(*data[i])));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteGptOssMxfp4Fixture(const std::string& dir, const GptOssFixtureSpec& s) {
  if (absl::Status st = MakeDir(dir); !st.ok()) return st;
  const uint64_t H = s.dims.hidden, E = s.dims.experts, D = s.head_dim;
  std::vector<TensorToWrite> t;
  t.push_back(Dense(s.seed, "model.embed_tokens.weight", {s.vocab, H}, 0.0f, 0.05f));
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back(Dense(s.seed, p + "input_layernorm.weight", {H}, 1.0f, 0.05f));
    t.push_back(Dense(s.seed, p + "post_attention_layernorm.weight", {H}, 1.0f, 0.05f));
    const std::pair<const char*, uint64_t> attn[] = {
        {"q_proj", s.heads * D}, {"k_proj", s.kv_heads * D}, {"v_proj", s.kv_heads * D}};
    for (const auto& [name, out] : attn) {
      t.push_back(Dense(s.seed, p + "self_attn." + name + ".weight", {out, H}, 0.0f, 0.1f));
      t.push_back(Dense(s.seed, p + "self_attn." + name + ".bias", {out}, 0.0f, 0.01f));
    }
    t.push_back(Dense(s.seed, p + "self_attn.o_proj.weight", {H, s.heads * D}, 0.0f, 0.1f));
    t.push_back(Dense(s.seed, p + "self_attn.o_proj.bias", {H}, 0.0f, 0.01f));
    t.push_back(Dense(s.seed, p + "self_attn.sinks", {s.heads}, 0.0f, 1.0f));
    t.push_back(Dense(s.seed, p + "mlp.router.weight", {E, H}, 0.0f, 0.1f));
    t.push_back(Dense(s.seed, p + "mlp.router.bias", {E}, 0.0f, 0.01f));
    for (Fused f : {Fused::kGateUp, Fused::kDown}) FillExperts(s, l, f, p + "mlp.experts.", &t);
  }
  t.push_back(Dense(s.seed, "model.norm.weight", {H}, 1.0f, 0.05f));
  t.push_back(Dense(s.seed, "lm_head.weight", {s.vocab, H}, 0.0f, 0.05f));
  if (absl::Status st =
          WriteText(fs::path(dir) / "config.json", DumpJson(Mxfp4Config(s), 2) + "\n");
      !st.ok()) {
    return st;
  }
  return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), std::move(t),
                          {{"format", "pt"}});
}

absl::Status WriteGptOssModelOpt(const std::string& src_root, const std::string& dir,
                                 ModelOptCast cast) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> src = Checkpoint::Open(src_root);
  if (!src.ok()) return src.status();
  absl::StatusOr<Dims> d = gptoss::DimsFromConfig((*src)->text_config());
  if (!d.ok()) return d.status();
  if (absl::Status st = MakeDir(dir); !st.ok()) return st;
  std::vector<TensorToWrite> t;
  for (const std::string& n : (*src)->TensorNames()) {
    if (absl::EndsWith(n, "_scales")) continue;
    if (absl::EndsWith(n, "_blocks")) {
      const std::string base = n.substr(0, n.size() - 7);
      const Fused f = absl::EndsWith(base, "gate_up_proj") ? Fused::kGateUp : Fused::kDown;
      if (absl::Status st = ExportFused(**src, *d, base, f, cast, &t); !st.ok()) return st;
      continue;
    }
    const TensorRef r = *(*src)->Find(n);
    t.push_back(TensorToWrite::Borrowed(*r.info, r.bytes()));
  }
  json config = (*src)->config();
  config["quantization_config"] = ModelOptQuantConfig();
  const json hf_quant = {{"producer", config["quantization_config"]["producer"]},
                         {"quantization",
                          {{"quant_algo", "NVFP4"},
                           {"kv_cache_quant_algo", nullptr},
                           {"group_size", 16},
                           {"exclude_modules", config["quantization_config"]["ignore"]}}}};
  for (const auto& [name, doc] : {std::pair<const char*, const json*>{"config.json", &config},
                                  {"hf_quant_config.json", &hf_quant}}) {
    if (absl::Status st = WriteText(fs::path(dir) / name, DumpJson(*doc, 2) + "\n"); !st.ok()) {
      return st;
    }
  }
  return WriteSafetensors((fs::path(dir) / "model.safetensors").string(), std::move(t),
                          {{"format", "pt"}});
}

absl::Status DumpGptOssValues(const std::string& root, const std::string& out) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ck = Checkpoint::Open(root);
  if (!ck.ok()) return ck.status();
  absl::StatusOr<Dims> d = gptoss::DimsFromConfig((*ck)->text_config());
  if (!d.ok()) return d.status();
  std::vector<TensorToWrite> t;
  for (const std::string& n : (*ck)->TensorNames()) {
    for (Fused f : {Fused::kGateUp, Fused::kDown}) {
      const std::string fused = gptoss::FusedName(f);
      const bool mx = absl::EndsWith(n, fused + "_blocks");
      const bool mo = absl::EndsWith(n, "." + fused);
      if (!mx && !mo) continue;
      const std::string base = mx ? n.substr(0, n.size() - 7) : n;
      const std::string scale = mx ? base + "_scales" : n + "_weight_scale";
      const std::optional<TensorRef> s = (*ck)->Find(scale),
                                     s2t = (*ck)->Find(n + "_weight_scale_2");
      if (!s || (!mx && (!s2t || s2t->bytes().size() != 4))) {
        return absl::InvalidArgumentError(absl::StrCat(root, ": ", n, ": scale tensors missing"));
      }
      const uint64_t E = d->experts, R = d->Rows(f), C = d->Cols(f);
      std::vector<float> values(E * R * C);
      if (mx) {
        absl::StatusOr<Mxfp4View> v =
            Mxfp4View::Make(base, (*ck)->Find(n)->bytes(), s->bytes(), E * R, C);
        if (!v.ok()) return v.status();
        for (uint64_t r = 0; r < E * R; ++r) {
          for (uint64_t c = 0; c < C; ++c) values[r * C + c] = static_cast<float>(v->Value(r, c));
        }
      } else {
        const std::span<const uint8_t> p = (*ck)->Find(n)->bytes(), sb = s->bytes();
        if (p.size() != E * R * C / 2 || sb.size() != E * R * C / 16) {
          return absl::InvalidArgumentError(absl::StrCat(root, ": ", n, ": sizes do not match"));
        }
        float s2;
        std::memcpy(&s2, s2t->bytes().data(), 4);
        for (uint64_t e = 0; e < E; ++e) {
          for (uint64_t r = 0; r < R; ++r) {
            for (uint64_t c = 0; c < C; ++c) {
              const gptoss::ElementAt at = gptoss::ModelOptPosition(*d, f, {e, r, c});
              const uint8_t b = p[at.code.byte];
              const uint8_t code = at.code.high ? HighNibble(b) : LowNibble(b);
              values[(e * R + r) * C + c] = static_cast<float>(
                  DecodeE2M1(code) * DecodeE4M3(sb[at.scale]) * static_cast<double>(s2));
            }
          }
        }
      }
      std::vector<uint8_t> bytes(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      t.push_back(TensorToWrite::Owned(base, DType::kF32, {E, R, C}, std::move(bytes)));
    }
  }
  return WriteSafetensors(out, std::move(t), {{"format", "pt"}});
}

}  // namespace ckpt::quant::testing
