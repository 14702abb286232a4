// The mini gpt-oss fixtures (tests/data/FIXTURES.md "mini-gpt-oss-*"), built from the format
// facts in docs/quant.md "gpt-oss layouts" through core/quant/gpt_oss_layout.h:
//
//  - WriteGptOssMxfp4Fixture: a small gpt-oss checkpoint in transformers' layout (quant_method
//    "mxfp4", `*_blocks`/`*_scales` experts, BF16 attention, router, embeddings and biases).
//    Every byte is a pure function of the spec. Active 32-groups of each fused tensor span
//    exactly 17 exponents below its k_max (the edge of the lossless window); odd experts carry
//    all-zero groups with scale bytes 250, 1, 0 and an in-window byte, except the last layer's
//    down_proj, whose all-zero groups carry 0 or in-window bytes only (the ModelOpt k_max rule
//    is lossless there and nowhere else).
//  - WriteGptOssModelOpt: that checkpoint exported in ModelOpt's gpt-oss NVFP4 layout (W4A4,
//    input_scale pinned to 1). kLossless: core/quant/gpt_oss_cast.h (one weight_scale_2 =
//    2^(k_max - 8) per fused tensor, k_max over the active groups). kModelOptRule: our model of
//    ModelOpt's closed-form cast (k_max over every nonzero scale byte, out-of-window blocks clamped
//    to [2^-9, 448] and their codes requantized), which the large bytes on all-zero groups make
//    lossy.
#ifndef CKPT_TESTS_QUANT_GPT_OSS_FIXTURE_H_
#define CKPT_TESTS_QUANT_GPT_OSS_FIXTURE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/quant/gpt_oss_layout.h"

namespace ckpt::quant::testing {

struct GptOssFixtureSpec {
  int layers = 2;
  gptoss::Dims dims{4, 96, 64};  // E, H, I: every axis of its own length
  uint64_t top_k = 2, vocab = 256, heads = 4, kv_heads = 2, head_dim = 16;
  uint64_t seed = 22;
};

// Writes config.json and model.safetensors into `dir` (created; it must not exist).
absl::Status WriteGptOssMxfp4Fixture(const std::string& dir, const GptOssFixtureSpec& spec = {});

enum class ModelOptCast { kLossless, kModelOptRule };
// Reads the gpt-oss MXFP4 checkpoint at `src`; writes config.json, hf_quant_config.json and
// model.safetensors into `dir` (created). FAILED_PRECONDITION when kLossless meets an active
// group outside the window or a NaN scale.
absl::Status WriteGptOssModelOpt(const std::string& src, const std::string& dir, ModelOptCast cast);

// Decoded values of every gpt-oss expert tensor of the checkpoint at `root`, F32 [E, R, C]
// (fused rows, input columns) under the fused tensor's name (`...experts.gate_up_proj`), into
// one safetensors file: MXFP4 through core/quant's Mxfp4View, ModelOpt NVFP4 through the
// layout module. tests/gpu/gpt_oss_transformers_check.py compares them with transformers.
absl::Status DumpGptOssValues(const std::string& root, const std::string& out);

}  // namespace ckpt::quant::testing

#endif  // CKPT_TESTS_QUANT_GPT_OSS_FIXTURE_H_
