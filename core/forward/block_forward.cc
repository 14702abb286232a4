#include "core/forward/block_forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"

namespace ckpt::forward {
namespace {

// T is the arithmetic type; kRound rounds stored activations to BF16 (Precision::kBF16).
template <typename T, bool kRound>
class Evaluator {
 public:
  Evaluator(const BlockConfig& c, const BlockWeights& w) : c_(c), w_(w) {}

  // Router logits, routing and the expert input (docs/forward.md steps 1-3).
  void Route(const BlockInput& input, BlockResult* r) const {
    const int64_t T_ = input.tokens, E = c_.experts, K = c_.top_k;
    r->tokens = T_;
    const std::vector<T> x(input.values.begin(), input.values.end());

    // 1. Router logits in the working precision (FP32 in the f32/bf16 modes, as specified).
    std::vector<T> logits = Linear(x, T_, w_.router);
    if (!w_.router_bias.empty()) AddBias(&logits, T_, w_.router_bias);
    r->router_logits.assign(logits.begin(), logits.end());

    // 2. Top-k selection and weights.
    r->topk_ids.resize(T_ * K);
    std::vector<T> weights(T_ * K);
    for (int64_t t = 0; t < T_; ++t) Route(&logits[t * E], &r->topk_ids[t * K], &weights[t * K]);
    r->topk_weights.assign(weights.begin(), weights.end());

    // 3. Expert input: the latent projection or the hidden state itself.
    r->latent_in.clear();
    if (c_.latent > 0) {
      std::vector<T> z = Linear(x, T_, w_.latent_down);
      Round(&z);
      r->latent_in.assign(z.begin(), z.end());
    }
  }

  // 4a. Expert `id` on every (token, slot) that chose it: h rows [slot, D]. Values are held as
  // double, which holds every T exactly.
  void Expert(const ExpertWeights& ex, int32_t id, const BlockInput& input, const BlockResult& r,
              std::vector<double>* h) const {
    const int64_t D = c_.latent > 0 ? c_.latent : c_.hidden;
    std::vector<int64_t> slots;  // token * K + slot, ascending
    for (size_t i = 0; i < r.topk_ids.size(); ++i) {
      if (r.topk_ids[i] == id) slots.push_back(static_cast<int64_t>(i));
    }
    if (slots.empty()) return;
    const std::vector<T> z = c_.latent > 0 ? std::vector<T>(r.latent_in.begin(), r.latent_in.end())
                                           : std::vector<T>(input.values.begin(), input.values.end());
    RunExpert(ex, z, D, slots, h);
  }

  // 6a. The shared expert on x.
  void Shared(const BlockInput& input, BlockResult* r) const {
    const int64_t T_ = input.tokens, H = c_.hidden;
    std::vector<T> shared(T_ * H, T(0));
    if (c_.shared_intermediate > 0) {
      const std::vector<T> x(input.values.begin(), input.values.end());
      const int64_t S = c_.shared_intermediate;
      std::vector<T> g = Linear(x, T_, w_.shared_gate);
      std::vector<T> u = Linear(x, T_, w_.shared_up);
      for (int64_t i = 0; i < T_ * S; ++i) g[i] = Glu(g[i], u[i]);
      Round(&g);
      shared = Linear(g, T_, w_.shared_down);
    }
    r->shared_out.assign(shared.begin(), shared.end());
  }

  // 4b-6b. Each token sums its experts in top-k slot order; latent norm and up-projection;
  // output = routed + shared.
  void Finish(const std::vector<double>& h, BlockResult* r) const {
    const int64_t T_ = r->tokens, H = c_.hidden, K = c_.top_k;
    const int64_t D = c_.latent > 0 ? c_.latent : H;
    const std::vector<T> weights(r->topk_weights.begin(), r->topk_weights.end());
    std::vector<T> y(T_ * D, T(0));
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          y[t * D + d] += weights[t * K + j] * static_cast<T>(h[(t * K + j) * D + d]);
        }
      }
    }

    // 5. Latent norm and up-projection.
    std::vector<T> routed = y;
    r->latent_out_normed.clear();
    if (c_.latent > 0) {
      if (c_.latent_norm) RmsNorm(&y, T_, D);
      Round(&y);
      r->latent_out_normed.assign(y.begin(), y.end());
      routed = Linear(y, T_, w_.latent_up);
    }
    r->routed_out.assign(routed.begin(), routed.end());
    r->output.resize(T_ * H);
    for (int64_t i = 0; i < T_ * H; ++i) {
      r->output[i] = static_cast<T>(routed[i] + static_cast<T>(r->shared_out[i]));
    }
  }

 private:
  static T Sigmoid(T v) { return T(1) / (T(1) + std::exp(-v)); }

  void Round(std::vector<T>* v) const {
    if constexpr (kRound) {
      for (T& e : *v) e = quant::DecodeBF16(quant::EncodeBF16(static_cast<float>(e)));
    }
  }

  T Glu(T g, T u) const {
    switch (c_.activation) {
      case Activation::kSiTUGlu: {
        const T b = static_cast<T>(c_.situ_beta), bl = static_cast<T>(c_.situ_linear_beta);
        return (b * std::tanh(g / b) * Sigmoid(g)) * (bl * std::tanh(u / bl));
      }
      case Activation::kSiluGlu:
        return g * Sigmoid(g) * u;
      case Activation::kClampedSwiGlu: {
        const T lim = static_cast<T>(c_.swiglu_limit);
        g = std::min(g, lim);
        u = std::clamp(u, -lim, lim);
        return g * Sigmoid(static_cast<T>(c_.swiglu_alpha) * g) * (u + T(1));
      }
    }
    return T(0);
  }

  // out[t, r] = sum_k x[t, k] * W[r, k], k ascending from +0. W's rows are decoded one at a
  // time (block_weights.h DenseMatrix).
  static std::vector<T> Linear(const std::vector<T>& x, int64_t tokens, const DenseMatrix& w) {
    const int64_t rows = w.rows, cols = w.cols;
    std::vector<T> out(tokens * rows);
    std::vector<float> wr(cols);
    for (int64_t r = 0; r < rows; ++r) {
      w.Row(r, wr.data());
      for (int64_t t = 0; t < tokens; ++t) {
        const T* xt = &x[t * cols];
        T acc = T(0);
        for (int64_t k = 0; k < cols; ++k) acc += xt[k] * static_cast<T>(wr[k]);
        out[t * rows + r] = acc;
      }
    }
    return out;
  }

  static void AddBias(std::vector<T>* v, int64_t tokens, const std::vector<float>& bias) {
    const int64_t n = bias.size();
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < n; ++i) (*v)[t * n + i] += static_cast<T>(bias[i]);
  }

  void Route(const T* logits, int32_t* ids, T* weights) const {
    const int64_t E = c_.experts, K = c_.top_k;
    std::vector<double> b(E);
    if (c_.family == BlockFamily::kGptOss) {
      for (int64_t e = 0; e < E; ++e) b[e] = logits[e];
      SelectTopK(c_, b.data(), ids);
      // Softmax over the selected logits; ids[0] holds the largest.
      T sum = T(0);
      for (int64_t j = 0; j < K; ++j) sum += (weights[j] = std::exp(logits[ids[j]] - logits[ids[0]]));
      for (int64_t j = 0; j < K; ++j) weights[j] /= sum;
      return;
    }
    std::vector<T> s(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = Sigmoid(logits[e]);
      b[e] = static_cast<T>(s[e] + static_cast<T>(w_.correction_bias[e]));
    }
    SelectTopK(c_, b.data(), ids);
    T sum = T(0);
    for (int64_t j = 0; j < K; ++j) sum += (weights[j] = s[ids[j]]);
    for (int64_t j = 0; j < K; ++j) {
      if (c_.norm_topk_prob) weights[j] /= (sum + static_cast<T>(1e-20));
      weights[j] *= static_cast<T>(c_.routed_scaling_factor);
    }
  }

  // h[slot] = GLU(z W1^T, z W3^T) W2^T (+ biases) for every (token, slot) routed to expert e.
  void RunExpert(const ExpertWeights& ex, const std::vector<T>& z, int64_t D,
                 const std::vector<int64_t>& slots, std::vector<double>* h) const {
    const int64_t I = c_.expert_intermediate, K = c_.top_k;
    std::vector<double> row(std::max(D, I));
    std::vector<T> a(slots.size() * I);
    std::vector<T> wg(D), wu(D);
    for (int64_t i = 0; i < I; ++i) {
      ex.gate.DequantizeRow(i, row.data());
      for (int64_t k = 0; k < D; ++k) wg[k] = static_cast<T>(row[k]);
      ex.up.DequantizeRow(i, row.data());
      for (int64_t k = 0; k < D; ++k) wu[k] = static_cast<T>(row[k]);
      for (size_t s = 0; s < slots.size(); ++s) {
        const T* zt = &z[(slots[s] / K) * D];
        T g = T(0), u = T(0);
        for (int64_t k = 0; k < D; ++k) g += zt[k] * wg[k];
        for (int64_t k = 0; k < D; ++k) u += zt[k] * wu[k];
        if (!ex.gate_bias.empty()) {
          g += static_cast<T>(ex.gate_bias[i]);
          u += static_cast<T>(ex.up_bias[i]);
        }
        a[s * I + i] = Glu(g, u);
      }
    }
    Round(&a);
    std::vector<T> wd(I);
    for (int64_t d = 0; d < D; ++d) {
      ex.down.DequantizeRow(d, row.data());
      for (int64_t k = 0; k < I; ++k) wd[k] = static_cast<T>(row[k]);
      for (size_t s = 0; s < slots.size(); ++s) {
        T acc = T(0);
        for (int64_t k = 0; k < I; ++k) acc += a[s * I + k] * wd[k];
        if (!ex.down_bias.empty()) acc += static_cast<T>(ex.down_bias[d]);
        (*h)[slots[s] * D + d] = acc;
      }
    }
  }

  void RmsNorm(std::vector<T>* y, int64_t tokens, int64_t D) const {
    for (int64_t t = 0; t < tokens; ++t) {
      T* v = &(*y)[t * D];
      T ss = T(0);
      for (int64_t d = 0; d < D; ++d) ss += v[d] * v[d];
      const T denom = std::sqrt(ss / static_cast<T>(D) + static_cast<T>(c_.rms_eps));
      for (int64_t d = 0; d < D; ++d) v[d] = v[d] / denom * static_cast<T>(w_.latent_norm[d]);
    }
  }

  const BlockConfig& c_;
  const BlockWeights& w_;
};

// Calls f with the evaluator of precision p.
template <typename F>
absl::Status WithEvaluator(Precision p, const BlockConfig& c, const BlockWeights& w, F f) {
  switch (p) {
    case Precision::kF64: f(Evaluator<double, false>(c, w)); return absl::OkStatus();
    case Precision::kF32: f(Evaluator<float, false>(c, w)); return absl::OkStatus();
    case Precision::kBF16: f(Evaluator<float, true>(c, w)); return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown precision");
}

absl::Status CheckInput(const BlockConfig& config, const BlockInput& input) {
  if (input.tokens <= 0 ||
      input.values.size() != static_cast<size_t>(input.tokens) * config.hidden) {
    return absl::InvalidArgumentError(absl::StrCat("block input: expected [T, ", config.hidden,
                                                   "] with T > 0, got ", input.values.size(),
                                                   " values for T = ", input.tokens));
  }
  return absl::OkStatus();
}

// The routed state a later stage takes must be a route stage's output for this input.
absl::Status CheckRouted(const BlockConfig& c, const BlockResult& r, size_t h_size) {
  const size_t D = c.latent > 0 ? c.latent : c.hidden;
  const size_t slots = static_cast<size_t>(r.tokens) * c.top_k;
  if (r.tokens <= 0 || r.topk_ids.size() != slots || r.topk_weights.size() != slots ||
      (c.latent > 0 && r.latent_in.size() != static_cast<size_t>(r.tokens) * D) ||
      h_size != slots * D) {
    return absl::InvalidArgumentError("block stages: routed state or expert outputs do not fit "
                                      "the block");
  }
  return absl::OkStatus();
}

}  // namespace

std::string PrecisionName(Precision p) {
  switch (p) {
    case Precision::kF64: return "f64";
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
  }
  return "?";
}

absl::StatusOr<Precision> ParsePrecision(const std::string& s) {
  for (Precision p : {Precision::kF64, Precision::kF32, Precision::kBF16}) {
    if (s == PrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown precision '", s, "' (f64|f32|bf16)"));
}

void SelectTopK(const BlockConfig& c, const double* b, int32_t* ids) {
  const int E = c.experts, per_group = E / c.n_group;
  std::vector<double> masked(b, b + E);
  if (c.n_group > 1) {
    std::vector<double> group_score(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<double> v(b + g * per_group, b + (g + 1) * per_group);
      std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
      group_score[g] = v[0] + v[1];
    }
    std::vector<int> order(c.n_group);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return group_score[x] > group_score[y]; });
    std::vector<bool> keep(c.n_group, false);
    for (int g = 0; g < c.topk_group; ++g) keep[order[g]] = true;
    for (int e = 0; e < E; ++e) {
      if (!keep[e / per_group]) masked[e] = 0.0;
    }
  }
  std::vector<int32_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return masked[x] > masked[y]; });
  std::copy(order.begin(), order.begin() + c.top_k, ids);
}

absl::Status RouteBlockCpu(const BlockConfig& c, const BlockWeights& w, const BlockInput& input,
                           Precision p, BlockResult* r) {
  if (absl::Status s = CheckInput(c, input); !s.ok()) return s;
  if (absl::Status s = CheckRoutingWeights(c, w); !s.ok()) return s;
  return WithEvaluator(p, c, w, [&](const auto& ev) { ev.Route(input, r); });
}

absl::Status RunExpertsCpu(const BlockConfig& c, const ExpertSet& experts,
                           const BlockInput& input, const BlockResult& routed, Precision p,
                           std::vector<double>* h) {
  if (absl::Status s = CheckInput(c, input); !s.ok()) return s;
  if (absl::Status s = CheckRouted(c, routed, h->size()); !s.ok()) return s;
  for (const auto& [id, ex] : experts) {
    if (absl::Status s = CheckExpertWeights(c, *ex); !s.ok()) return s;
  }
  static const BlockWeights kNoDenseWeights;
  return WithEvaluator(p, c, kNoDenseWeights, [&](const auto& ev) {
    for (const auto& [id, ex] : experts) ev.Expert(*ex, id, input, routed, h);
  });
}

absl::Status RunSharedCpu(const BlockConfig& c, const BlockWeights& w, const BlockInput& input,
                          Precision p, BlockResult* r) {
  if (absl::Status s = CheckInput(c, input); !s.ok()) return s;
  if (absl::Status s = CheckSharedWeights(c, w); !s.ok()) return s;
  return WithEvaluator(p, c, w, [&](const auto& ev) { ev.Shared(input, r); });
}

absl::Status FinishBlockCpu(const BlockConfig& c, const BlockWeights& w,
                            const std::vector<double>& h, Precision p, BlockResult* r) {
  if (absl::Status s = CheckRouted(c, *r, h.size()); !s.ok()) return s;
  if (r->shared_out.size() != static_cast<size_t>(r->tokens) * c.hidden) {
    return absl::InvalidArgumentError("block stages: the shared expert has not run");
  }
  if (absl::Status s = CheckLatentOutWeights(c, w); !s.ok()) return s;
  return WithEvaluator(p, c, w, [&](const auto& ev) { ev.Finish(h, r); });
}

BlockStages CpuStages() { return {RouteBlockCpu, RunExpertsCpu, RunSharedCpu, FinishBlockCpu}; }

absl::StatusOr<BlockResult> RunStages(const BlockStages& stages, const BlockConfig& c,
                                      const BlockWeights& w, const BlockInput& input,
                                      Precision p) {
  BlockResult r;
  if (absl::Status s = stages.route(c, w, input, p, &r); !s.ok()) return s;
  const size_t D = c.latent > 0 ? c.latent : c.hidden;
  std::vector<double> h(r.topk_ids.size() * D, 0.0);
  ExpertSet experts;
  for (int32_t id : std::set<int32_t>(r.topk_ids.begin(), r.topk_ids.end())) {
    if (id < 0 || static_cast<size_t>(id) >= w.experts.size()) {
      return absl::InternalError(absl::StrCat("routing chose expert ", id, " of ",
                                              w.experts.size()));
    }
    experts.emplace_back(id, &w.experts[id]);
  }
  if (absl::Status s = stages.experts(c, experts, input, r, p, &h); !s.ok()) return s;
  if (absl::Status s = stages.shared(c, w, input, p, &r); !s.ok()) return s;
  if (absl::Status s = stages.finish(c, w, h, p, &r); !s.ok()) return s;
  return r;
}

absl::StatusOr<BlockResult> RunBlockCpu(const BlockConfig& config, const BlockWeights& weights,
                                        const BlockInput& input, Precision precision) {
  if (absl::Status s = CheckBlockWeights(config, weights); !s.ok()) return s;
  return RunStages(CpuStages(), config, weights, input, precision);
}

}  // namespace ckpt::forward
