// Launchers of the CUDA kernels of an MoE block forward (W4A16: BF16 activations, FP32
// accumulation, FP4 expert weights dequantized inside the GEMVs). Plain C++ over device
// pointers, so the host code (block_forward_cuda.cc) and the benchmark share it without nvcc.
//
// Expert GEMVs run on BF16 tensor cores (mma.sync m16n8k16): FP4 codes are decoded to their
// exact BF16 values, each MMA output is the dot product of one 16-element block with one token
// (exact products, summed by the tensor core at FP32 precision in its fixed hardware order, which
// IEEE does not specify: the CPU reference agrees to ~1e-7 relative, not bitwise), and the
// block's scale is applied to that FP32 sum with one fmaf into a per-lane accumulator, blocks of
// a lane in ascending order; the four lanes of a quad are then added by an xor-butterfly (1, 2).
// An MXFP4 block scale 2^k and an NVFP4 E4M3/global equal to it therefore give equal bits.
// Determinism: a fixed reduction order everywhere and no atomics on outputs, so equal inputs
// give equal bits on every run. The combine adds the top-k terms of an element in ascending j.
#ifndef CKPT_GPU_MOE_KERNELS_H_
#define CKPT_GPU_MOE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ckpt::gpu {

enum class Fp4Kind : int { kMxfp4 = 0, kNvfp4 = 1 };
enum class GluKind : int { kSiTU = 0, kSilu = 1, kClampedSwiGlu = 2 };

struct GluParams {
  GluKind kind = GluKind::kSiTU;
  float beta = 4.0f, linear_beta = 25.0f;  // SiTU
  float limit = 7.0f, alpha = 1.702f;      // clamped SwiGLU
};

// One FP4 matrix on the device: packed [rows, cols/2], scales [rows, cols/16 or cols/32].
struct DeviceFp4 {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  // NVFP4: the global scale divides (compressed-tensors) or, when global_multiplies is set,
  // multiplies (ModelOpt) every block scale (docs/formats.md §4, §9).
  float global_scale = 1.0f;
  int global_multiplies = 0;
};

struct DeviceExpert {
  DeviceFp4 gate, up, down;
  const float* gate_bias = nullptr;  // gpt-oss only; null otherwise
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

// The routed-expert stage for `num_experts` distinct experts. Pairs p in
// [pair_offsets[u], pair_offsets[u+1]) of expert u name slots (token * top_k + j) that chose it.
struct ExpertLaunch {
  Fp4Kind kind = Fp4Kind::kMxfp4;
  GluParams glu;
  int in_dim = 0;        // D: latent (or hidden) width; multiple of 32
  int intermediate = 0;  // I: multiple of 32
  int top_k = 0;
  int num_experts = 0;
  const DeviceExpert* experts = nullptr;  // [num_experts], device memory
  const int* pair_offsets = nullptr;      // [num_experts + 1]
  const int* pair_slots = nullptr;        // [tokens * top_k]
  const uint16_t* z = nullptr;            // BF16 [tokens, D]
  uint16_t* a = nullptr;                  // BF16 [tokens * top_k, I] (scratch)
  float* h = nullptr;                     // [tokens * top_k, D]
};
void LaunchExperts(const ExpertLaunch& l, cudaStream_t stream);

// y[t] = sum_j w[t, j] * h[t * top_k + j] (j ascending); then, if norm_weight is set,
// y / sqrt(mean(y^2) + eps) * norm_weight. Writes y as float and as BF16.
void LaunchCombine(const float* h, const float* topk_weights, int tokens, int top_k, int dim,
                   const float* norm_weight, float eps, float* y, uint16_t* y_bf16,
                   cudaStream_t stream);

// out[t, r] = sum_k x[t, k] * W[r, k] (+ bias[r]); W is F32 or BF16 row-major [rows, cols]
// (cols a multiple of 8). Optional BF16 copy of the output.
void LaunchLinearF32(const uint16_t* x, int tokens, const float* w, const float* bias, int rows,
                     int cols, float* out, uint16_t* out_bf16, cudaStream_t stream);
void LaunchLinearBF16(const uint16_t* x, int tokens, const uint16_t* w, const float* bias,
                      int rows, int cols, float* out, uint16_t* out_bf16, cudaStream_t stream);

// a = BF16(GLU(g, u)) elementwise over n values.
void LaunchGlu(const float* g, const float* u, int n, GluParams glu, uint16_t* a,
               cudaStream_t stream);

// Routing per token: sigmoid scores + correction bias with grouped top-k (noaux_tc), or, when
// `softmax` is set, top-k on the logits and softmax over the selected (gpt-oss).
struct TopKLaunch {
  const float* logits = nullptr;  // [tokens, experts]
  const float* correction_bias = nullptr;
  int tokens = 0, experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  bool softmax = false;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  int* ids = nullptr;        // [tokens, top_k]
  float* weights = nullptr;  // [tokens, top_k]
};
void LaunchTopK(const TopKLaunch& l, cudaStream_t stream);

// out[i] = a[i] + b[i].
void LaunchAdd(const float* a, const float* b, int n, float* out, cudaStream_t stream);

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_MOE_KERNELS_H_
