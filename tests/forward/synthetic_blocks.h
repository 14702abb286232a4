// Small synthetic MoE weights for tests of the CPU and CUDA block forwards: FP4 matrices
// whose nibbles come from a formula, and dense matrices with a few distinct exact values.
#ifndef CKPT_TESTS_FORWARD_SYNTHETIC_BLOCKS_H_
#define CKPT_TESTS_FORWARD_SYNTHETIC_BLOCKS_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/forward/block_config.h"
#include "core/forward/block_weights.h"

namespace ckpt::forward {

// An MXFP4 matrix whose every group has scale 2^0 and whose nibbles come from `code(r, c)`.
inline Fp4Matrix MakeFp4(const std::string& name, int64_t rows, int64_t cols,
                  const std::function<uint8_t(int64_t, int64_t)>& code, uint8_t scale = 127) {
  auto store = std::make_shared<std::vector<uint8_t>>(rows * cols / 2 + rows * cols / 32);
  uint8_t* p = store->data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 2)
      p[(r * cols + c) / 2] = code(r, c) | (code(r, c + 1) << 4);
  uint8_t* s = p + rows * cols / 2;
  std::fill(s, s + rows * cols / 32, scale);
  return {name, Fp4Scale::kE8M0Group32, rows, cols, {p, static_cast<size_t>(rows * cols / 2)},
          {s, static_cast<size_t>(rows * cols / 32)}, {}, store};
}

inline DenseMatrix MakeDense(const std::string& name, int64_t rows, int64_t cols, double step) {
  std::vector<float> values;
  for (int64_t i = 0; i < rows * cols; ++i) values.push_back(((i * 7) % 11 - 5) * step);
  return DenseMatrix::Of(name, rows, cols, std::move(values));
}

struct SyntheticBlock {
  BlockConfig config;
  BlockWeights weights;
};

// A gpt-oss block: 4 experts, top-2, biases, gate/up values that leave the clamp range.
inline SyntheticBlock GptOssSynthetic() {
  BlockConfig c;
  c.family = BlockFamily::kGptOss;
  c.activation = Activation::kClampedSwiGlu;
  c.hidden = 32;
  c.expert_intermediate = 32;
  c.experts = 4;
  c.top_k = 2;
  BlockWeights w;
  w.router = MakeDense("router", 4, 32, 0.125);
  w.router_bias = {0.5f, -0.25f, 0.0f, 1.0f};
  // Large codes (6 = magnitude 4) make gate/up leave [-7, 7] so the clamp is exercised.
  for (int e = 0; e < 4; ++e) {
    ExpertWeights x;
    x.gate = MakeFp4("g", 32, 32, [e](int64_t r, int64_t k) { return (r + k + e) % 3 == 0 ? 6 : 0; });
    x.up = MakeFp4("u", 32, 32, [e](int64_t r, int64_t k) { return (r * k + e) % 5 == 0 ? 14 : 2; });
    x.down = MakeFp4("d", 32, 32, [e](int64_t r, int64_t k) { return (r + 2 * k + e) % 4 == 0 ? 9 : 1; });
    for (int i = 0; i < 32; ++i) {
      x.gate_bias.push_back(0.25f * e);
      x.up_bias.push_back(-0.5f);
      x.down_bias.push_back(0.125f * i);
    }
    w.experts.push_back(std::move(x));
  }
  return {c, std::move(w)};
}

// A DeepSeek-V3 block: 8 experts in 4 groups, top-2 of the best 2 groups, a shared expert.
inline SyntheticBlock DeepSeekSynthetic() {
  BlockConfig c;
  c.family = BlockFamily::kDeepSeekV3;
  c.activation = Activation::kSiluGlu;
  c.hidden = 32;
  c.expert_intermediate = 32;
  c.shared_intermediate = 32;
  c.experts = 8;
  c.top_k = 2;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  BlockWeights w;
  w.router = MakeDense("router", 8, 32, 0.0625);
  w.correction_bias = {0.0f, 0.1f, -0.1f, 0.2f, 0.0f, 0.3f, -0.2f, 0.05f};
  for (int e = 0; e < 8; ++e) {
    ExpertWeights x;
    x.gate = MakeFp4("g", 32, 32, [e](int64_t r, int64_t k) { return (r + k + e) % 7; }, 124);
    x.up = MakeFp4("u", 32, 32, [e](int64_t r, int64_t k) { return (r * 3 + k + e) % 16; }, 124);
    x.down = MakeFp4("d", 32, 32, [e](int64_t r, int64_t k) { return (r + k * e) % 16; }, 124);
    w.experts.push_back(std::move(x));
  }
  w.shared_gate = MakeDense("sg", 32, 32, 0.03125);
  w.shared_up = MakeDense("su", 32, 32, 0.0625);
  w.shared_down = MakeDense("sd", 32, 32, 0.125);
  return {c, std::move(w)};
}

}  // namespace ckpt::forward

#endif  // CKPT_TESTS_FORWARD_SYNTHETIC_BLOCKS_H_
