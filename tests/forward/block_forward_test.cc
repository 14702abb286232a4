// The CPU reference block forward against the float64 oracle (Kimi LatentMoE) and against
// independent naive computations on synthetic weights (DeepSeek-V3 and gpt-oss blocks).
#include "core/forward/block_forward.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/checkpoint.h"
#include "core/quant/codecs.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "tests/forward/synthetic_blocks.h"
#include "tests/test_util.h"

namespace ckpt::forward {
namespace {

using ::ckpt::testing::Fixture;

struct Oracle {
  std::unique_ptr<SafetensorsFile> file;
  std::vector<double> F64(const std::string& name) const {
    const TensorInfo* t = file->Find(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<double> v(t->num_elements());
    std::memcpy(v.data(), file->Bytes(*t).data(), v.size() * 8);
    return v;
  }
};

Oracle LoadOracle() {
  auto f = SafetensorsFile::Open(Fixture("oracle/mini-kimi-block-L1.safetensors").string());
  EXPECT_TRUE(f.ok()) << f.status();
  return Oracle{std::move(*f)};
}

BlockInput OracleInput(const Oracle& o) {
  const TensorInfo* t = o.file->Find("input");
  BlockInput in;
  in.tokens = t->shape[0];
  auto b = o.file->Bytes(*t);
  for (size_t i = 0; i < t->num_elements(); ++i) {
    uint16_t v;
    std::memcpy(&v, b.data() + 2 * i, 2);
    in.values.push_back(quant::DecodeBF16(v));
  }
  return in;
}

// max |a - b| / max |b|: relative to the tensor's scale, so near-zero elements do not dominate.
double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den == 0 ? num : num / den;
}

struct Loaded {
  std::unique_ptr<Checkpoint> ckpt;
  BlockConfig config;
  BlockWeights weights;
};

Loaded LoadFixture(const std::string& name, int layer) {
  Loaded l;
  auto c = Checkpoint::Open(Fixture(name).string());
  EXPECT_TRUE(c.ok()) << c.status();
  l.ckpt = std::move(*c);
  auto cfg = ParseBlockConfig(l.ckpt->text_config(), layer);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  l.config = *cfg;
  auto w = LoadBlockWeights(*l.ckpt, l.config, layer);
  EXPECT_TRUE(w.ok()) << w.status();
  l.weights = std::move(*w);
  return l;
}

void ExpectMatchesOracle(const BlockResult& r, const Oracle& o, double tol) {
  std::vector<int32_t> ids(r.topk_ids.size());
  const TensorInfo* t = o.file->Find("topk_ids");
  ASSERT_EQ(t->num_elements(), ids.size());
  std::memcpy(ids.data(), o.file->Bytes(*t).data(), ids.size() * 4);
  EXPECT_EQ(r.topk_ids, ids);
  const std::pair<const char*, const std::vector<double>*> named[] = {
      {"router_logits", &r.router_logits}, {"topk_weights", &r.topk_weights},
      {"latent_in", &r.latent_in},         {"latent_out_normed", &r.latent_out_normed},
      {"routed_out", &r.routed_out},       {"shared_out", &r.shared_out},
      {"output", &r.output}};
  for (const auto& [name, values] : named) {
    const double rel = RelError(*values, o.F64(name));
    std::printf("[ measured ] %s: max relative error vs oracle = %.3e\n", name, rel);
    EXPECT_LE(rel, tol) << name;
  }
}

TEST(KimiBlock, ConfigFromFixture) {
  Loaded l = LoadFixture("mini-kimi-mxfp4", 1);
  EXPECT_EQ(l.config.family, BlockFamily::kKimiLatent);
  EXPECT_EQ(l.config.hidden, 256);
  EXPECT_EQ(l.config.latent, 128);
  EXPECT_EQ(l.config.expert_intermediate, 192);
  EXPECT_EQ(l.config.shared_intermediate, 256);
  EXPECT_EQ(l.config.experts, 16);
  EXPECT_EQ(l.config.top_k, 4);
  EXPECT_EQ(l.config.n_group, 4);
  EXPECT_EQ(l.config.topk_group, 2);
  EXPECT_DOUBLE_EQ(l.config.routed_scaling_factor, 2.5);
  EXPECT_FALSE(ParseBlockConfig(l.ckpt->text_config(), 0).ok());  // dense layer
}

TEST(KimiBlock, Float64MatchesOracle) {
  Oracle o = LoadOracle();
  Loaded l = LoadFixture("mini-kimi-mxfp4", 1);
  auto r = RunBlockCpu(l.config, l.weights, OracleInput(o), Precision::kF64);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesOracle(*r, o, 1e-12);
}

TEST(KimiBlock, Float32WithinTolerance) {
  Oracle o = LoadOracle();
  Loaded l = LoadFixture("mini-kimi-mxfp4", 1);
  auto r = RunBlockCpu(l.config, l.weights, OracleInput(o), Precision::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectMatchesOracle(*r, o, 1e-5);
  // And it really is float arithmetic: at least one value differs from the f64 result.
  auto d = RunBlockCpu(l.config, l.weights, OracleInput(o), Precision::kF64);
  ASSERT_TRUE(d.ok());
  EXPECT_NE(r->output, d->output);
}

TEST(KimiBlock, Nvfp4TranscodeGivesIdenticalBits) {
  Oracle o = LoadOracle();
  Loaded src = LoadFixture("mini-kimi-mxfp4", 1);
  Loaded nv = LoadFixture("mini-kimi-nvfp4", 1);
  EXPECT_EQ(nv.weights.experts[0].gate.scale_kind, Fp4Scale::kE4M3Group16);
  for (Precision p : {Precision::kF64, Precision::kF32, Precision::kBF16}) {
    auto a = RunBlockCpu(src.config, src.weights, OracleInput(o), p);
    auto b = RunBlockCpu(nv.config, nv.weights, OracleInput(o), p);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->output, b->output) << PrecisionName(p);
    EXPECT_EQ(a->topk_ids, b->topk_ids);
  }
}

TEST(KimiBlock, RejectsWrongInputWidth) {
  Loaded l = LoadFixture("mini-kimi-mxfp4", 1);
  BlockInput in{2, std::vector<float>(2 * 255, 0.0f)};
  EXPECT_EQ(RunBlockCpu(l.config, l.weights, in, Precision::kF64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SelectTopK, GroupedMasksLosingGroups) {
  BlockConfig c;
  c.experts = 8;
  c.top_k = 2;
  c.n_group = 4;
  c.topk_group = 1;
  // Group 1 (experts 2, 3) has the best top-2 sum although expert 6 has the largest score.
  const double b[8] = {0.1, 0.2, 0.5, 0.45, 0.0, 0.0, 0.9, -0.5};
  int32_t ids[2];
  SelectTopK(c, b, ids);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  c.topk_group = 4;
  SelectTopK(c, b, ids);
  EXPECT_EQ(ids[0], 6);
  EXPECT_EQ(ids[1], 2);
}

// ---- Synthetic blocks: small weights whose expected outputs are computed naively here. ----

double Sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }

TEST(GptOssBlock, SoftmaxTopKClampedSwiGluAndBiases) {
  auto [c, w] = GptOssSynthetic();
  BlockInput in{3, {}};
  for (int i = 0; i < 3 * 32; ++i) in.values.push_back(((i * 5) % 9 - 4) * 0.5f);
  auto r = RunBlockCpu(c, w, in, Precision::kF64);
  ASSERT_TRUE(r.ok()) << r.status();

  bool clamped = false;
  for (int t = 0; t < 3; ++t) {
    const float* x = &in.values[t * 32];
    double logits[4];
    for (int e = 0; e < 4; ++e) {
      logits[e] = w.router_bias[e];
      for (int k = 0; k < 32; ++k) logits[e] += x[k] * w.router.At(e * 32 + k);
      EXPECT_NEAR(r->router_logits[t * 4 + e], logits[e], 1e-12);
    }
    // The two largest logits, softmaxed.
    int best = 0;
    for (int e = 1; e < 4; ++e) if (logits[e] > logits[best]) best = e;
    int second = best == 0 ? 1 : 0;
    for (int e = 0; e < 4; ++e) if (e != best && logits[e] > logits[second]) second = e;
    EXPECT_EQ(r->topk_ids[t * 2], best);
    EXPECT_EQ(r->topk_ids[t * 2 + 1], second);
    const double w0 = 1.0 / (1.0 + std::exp(logits[second] - logits[best]));
    EXPECT_NEAR(r->topk_weights[t * 2], w0, 1e-12);
    EXPECT_NEAR(r->topk_weights[t * 2] + r->topk_weights[t * 2 + 1], 1.0, 1e-12);

    std::vector<double> expect(32, 0.0);
    for (int j = 0; j < 2; ++j) {
      const ExpertWeights& x_e = w.experts[r->topk_ids[t * 2 + j]];
      std::vector<double> a(32), row(32);
      for (int i = 0; i < 32; ++i) {
        double g = x_e.gate_bias[i], u = x_e.up_bias[i];
        x_e.gate.DequantizeRow(i, row.data());
        for (int k = 0; k < 32; ++k) g += x[k] * row[k];
        x_e.up.DequantizeRow(i, row.data());
        for (int k = 0; k < 32; ++k) u += x[k] * row[k];
        if (g > 7 || std::abs(u) > 7) clamped = true;
        g = std::min(g, 7.0);
        u = std::max(-7.0, std::min(u, 7.0));
        a[i] = g * Sig(1.702 * g) * (u + 1);
      }
      for (int d = 0; d < 32; ++d) {
        x_e.down.DequantizeRow(d, row.data());
        double h = x_e.down_bias[d];
        for (int k = 0; k < 32; ++k) h += a[k] * row[k];
        expect[d] += r->topk_weights[t * 2 + j] * h;
      }
    }
    for (int d = 0; d < 32; ++d) {
      EXPECT_NEAR(r->output[t * 32 + d], expect[d], 1e-9 * (1 + std::abs(expect[d])));
      EXPECT_EQ(r->shared_out[t * 32 + d], 0.0);
    }
  }
  EXPECT_TRUE(clamped) << "the synthetic weights must exercise the clamp";
}

TEST(DeepSeekV3Block, SigmoidGroupedRoutingSiluExpertsAndSharedExpert) {
  auto [c, w] = DeepSeekSynthetic();
  BlockInput in{2, {}};
  for (int i = 0; i < 2 * 32; ++i) in.values.push_back(((i * 3) % 7 - 3) * 0.25f);
  auto r = RunBlockCpu(c, w, in, Precision::kF64);
  ASSERT_TRUE(r.ok()) << r.status();
  auto silu_glu = [](double g, double u) { return g * Sig(g) * u; };

  for (int t = 0; t < 2; ++t) {
    const float* x = &in.values[t * 32];
    double s[8], b[8];
    for (int e = 0; e < 8; ++e) {
      double l = 0;
      for (int k = 0; k < 32; ++k) l += x[k] * w.router.At(e * 32 + k);
      s[e] = Sig(l);
      b[e] = s[e] + w.correction_bias[e];
    }
    // Groups of two: the group score is the pair's sum; keep the best two groups.
    double gs[4];
    for (int g = 0; g < 4; ++g) gs[g] = b[2 * g] + b[2 * g + 1];
    int g1 = 0;
    for (int g = 1; g < 4; ++g) if (gs[g] > gs[g1]) g1 = g;
    int g2 = g1 == 0 ? 1 : 0;
    for (int g = 0; g < 4; ++g) if (g != g1 && gs[g] > gs[g2]) g2 = g;
    int e1 = -1, e2 = -1;
    for (int e : {2 * g1, 2 * g1 + 1, 2 * g2, 2 * g2 + 1}) {
      if (e1 < 0 || b[e] > b[e1]) { e2 = e1; e1 = e; }
      else if (e2 < 0 || b[e] > b[e2]) e2 = e;
    }
    EXPECT_EQ(r->topk_ids[t * 2], e1);
    EXPECT_EQ(r->topk_ids[t * 2 + 1], e2);
    const double sum = s[e1] + s[e2];
    EXPECT_NEAR(r->topk_weights[t * 2], s[e1] / sum * 2.5, 1e-12);
    EXPECT_NEAR(r->topk_weights[t * 2] + r->topk_weights[t * 2 + 1], 2.5, 1e-12);

    std::vector<double> expect(32, 0.0), row(32), a(32);
    for (int j = 0; j < 2; ++j) {
      const ExpertWeights& xe = w.experts[j == 0 ? e1 : e2];
      for (int i = 0; i < 32; ++i) {
        double g = 0, u = 0;
        xe.gate.DequantizeRow(i, row.data());
        for (int k = 0; k < 32; ++k) g += x[k] * row[k];
        xe.up.DequantizeRow(i, row.data());
        for (int k = 0; k < 32; ++k) u += x[k] * row[k];
        a[i] = silu_glu(g, u);
      }
      for (int d = 0; d < 32; ++d) {
        xe.down.DequantizeRow(d, row.data());
        double h = 0;
        for (int k = 0; k < 32; ++k) h += a[k] * row[k];
        expect[d] += r->topk_weights[t * 2 + j] * h;
      }
    }
    for (int i = 0; i < 32; ++i) {
      double g = 0, u = 0;
      for (int k = 0; k < 32; ++k) {
        g += x[k] * w.shared_gate.At(i * 32 + k);
        u += x[k] * w.shared_up.At(i * 32 + k);
      }
      a[i] = silu_glu(g, u);
    }
    for (int d = 0; d < 32; ++d) {
      double sh = 0;
      for (int k = 0; k < 32; ++k) sh += a[k] * w.shared_down.At(d * 32 + k);
      EXPECT_NEAR(r->shared_out[t * 32 + d], sh, 1e-9 * (1 + std::abs(sh)));
      EXPECT_NEAR(r->routed_out[t * 32 + d], expect[d], 1e-9 * (1 + std::abs(expect[d])));
      EXPECT_NEAR(r->output[t * 32 + d], expect[d] + sh, 1e-9 * (1 + std::abs(expect[d] + sh)));
    }
  }
}

}  // namespace
}  // namespace ckpt::forward
