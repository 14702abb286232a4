// CUDA kernels of the MoE block forward; the contract is in moe_kernels.h. Rounding is spelled
// out with __fmul_rn/__fadd_rn/fmaf wherever a contraction could change bits between builds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/moe_kernels.h"

namespace ckpt::gpu {
namespace {

constexpr int kWarps = 8;       // warps per block; each warp owns one output row at a time
constexpr int kChunk = 2;       // tokens whose accumulators a lane holds at once (small: occupancy)
constexpr int kPrefetch = 2;    // 32-element groups a lane loads ahead of use

__device__ __forceinline__ float Bf16ToFloat(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
__device__ __forceinline__ uint16_t FloatToBf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// 2^(s-127); 0xFF (NaN) only survives validation on all-zero groups, so it scales to 0.
__device__ __forceinline__ float E8M0(uint32_t s) {
  if (s == 0xFFu) return 0.0f;
  return s == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23);
}

__device__ __forceinline__ float E4M3(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return 0.0f;  // NaN: as for E8M0
  const float v = e == 0u ? __fmul_rn(static_cast<float>(m), 0x1p-9f)
                          : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}

// The two 16-element block scales of 32-element group g of a row.
template <Fp4Kind K>
__device__ __forceinline__ void GroupScales(const uint8_t* scale_row, int g, float global,
                                            float* s0, float* s1) {
  if constexpr (K == Fp4Kind::kMxfp4) {
    *s0 = *s1 = E8M0(scale_row[g]);
  } else {
    *s0 = __fdiv_rn(E4M3(scale_row[2 * g]), global);
    *s1 = __fdiv_rn(E4M3(scale_row[2 * g + 1]), global);
  }
}

// Two E2M1 codes (one packed byte) -> two floats, each 2^-14 times the code's value: the
// magnitude bits (e1 e0 m) are placed at FP16 bits 11..9 and the sign at bit 15, which makes
// the FP16 number 2^-14 * value for every code, subnormals included (0.5 -> 2^-15). Pure ALU:
// measured faster on the H200 than shared-memory lookup tables (docs/forward.md).
__device__ __forceinline__ float2 E2M1PairScaled(uint32_t byte) {
  uint32_t h = ((byte & 0x7u) << 9) | ((byte & 0x8u) << 12) | ((byte & 0x70u) << 21) |
               ((byte & 0x80u) << 24);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// sum_{i<16} e2m1(w_i) * x_i for 8 packed bytes and 16 BF16 activations, i ascending. The
// products are exact, so summing 2^-14-scaled values and rescaling once gives the same float
// as summing the values themselves (barring subnormal products).
__device__ __forceinline__ float Dot16(uint32_t w0, uint32_t w1, uint4 xa, uint4 xb) {
  const uint32_t w[2] = {w0, w1};
  const uint32_t x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 v = E2M1PairScaled(w[i / 4] >> (8 * (i % 4)));
    acc = fmaf(v.x, __uint_as_float(x[i] << 16), acc);
    acc = fmaf(v.y, __uint_as_float(x[i] & 0xFFFF0000u), acc);
  }
  return __fmul_rn(acc, 16384.0f);
}

// One 32-element group's contribution: (dot(block 0) * s0 + dot(block 1) * s1).
__device__ __forceinline__ float GroupDot(uint4 w, const uint16_t* x,
                                          float s0, float s1) {
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const float p0 = Dot16(w.x, w.y, __ldg(xv), __ldg(xv + 1));
  const float p1 = Dot16(w.z, w.w, __ldg(xv + 2), __ldg(xv + 3));
  return __fadd_rn(__fmul_rn(p0, s0), __fmul_rn(p1, s1));
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float Sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v))); }

__device__ __forceinline__ float Glu(const GluParams& p, float g, float u) {
  switch (p.kind) {
    case GluKind::kSiTU:
      return (p.beta * tanhf(g / p.beta) * Sigmoid(g)) * (p.linear_beta * tanhf(u / p.linear_beta));
    case GluKind::kSilu:
      return g * Sigmoid(g) * u;
    case GluKind::kClampedSwiGlu:
      g = fminf(g, p.limit);
      u = fmaxf(-p.limit, fminf(u, p.limit));
      return g * Sigmoid(p.alpha * g) * (u + 1.0f);
  }
  return 0.0f;
}

// a[slot, r] = BF16(GLU(z_t . gate_r, z_t . up_r)) for row r of every pair of expert blockIdx.y.
template <Fp4Kind K>
__global__ void __launch_bounds__(kWarps * 32, 4) GateUpKernel(ExpertLaunch l) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * kWarps + warp;
  if (r >= l.intermediate) return;
  const DeviceExpert& ex = l.experts[blockIdx.y];
  const int D = l.in_dim, groups = D / 32;
  const int spr = K == Fp4Kind::kMxfp4 ? D / 32 : D / 16;
  const uint8_t* gp = ex.gate.packed + static_cast<size_t>(r) * (D / 2);
  const uint8_t* up = ex.up.packed + static_cast<size_t>(r) * (D / 2);
  const uint8_t* gs = ex.gate.scales + static_cast<size_t>(r) * spr;
  const uint8_t* us = ex.up.scales + static_cast<size_t>(r) * spr;
  const int p0 = l.pair_offsets[blockIdx.y], p1 = l.pair_offsets[blockIdx.y + 1];
  for (int c0 = p0; c0 < p1; c0 += kChunk) {
    const int n = min(kChunk, p1 - c0);
    float ag[kChunk], au[kChunk];
    const uint16_t* zrow[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      ag[c] = au[c] = 0.0f;
      zrow[c] = l.z + static_cast<size_t>(l.pair_slots[c0 + min(c, n - 1)] / l.top_k) * D;
    }
    // Each lane takes groups lane, lane + 32, ... ascending; kPrefetch of them are loaded
    // before any is used so that a warp keeps several 512-byte loads in flight.
    for (int g0 = lane; g0 < groups; g0 += 32 * kPrefetch) {
      uint4 wg[kPrefetch], wu[kPrefetch];
      float sg0[kPrefetch], sg1[kPrefetch], su0[kPrefetch], su1[kPrefetch];
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int g = g0 + 32 * i;
        if (g < groups) {
          wg[i] = __ldg(reinterpret_cast<const uint4*>(gp) + g);
          wu[i] = __ldg(reinterpret_cast<const uint4*>(up) + g);
          GroupScales<K>(gs, g, ex.gate.global_scale, &sg0[i], &sg1[i]);
          GroupScales<K>(us, g, ex.up.global_scale, &su0[i], &su1[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int g = g0 + 32 * i;
        if (g >= groups) break;
#pragma unroll
        for (int c = 0; c < kChunk; ++c) {
          if (c < n) {
            ag[c] = __fadd_rn(ag[c], GroupDot(wg[i], zrow[c] + g * 32, sg0[i], sg1[i]));
            au[c] = __fadd_rn(au[c], GroupDot(wu[i], zrow[c] + g * 32, su0[i], su1[i]));
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (c < n) {
        float g = WarpSum(ag[c]), u = WarpSum(au[c]);
        if (lane == 0) {
          if (ex.gate_bias != nullptr) {
            g = __fadd_rn(g, ex.gate_bias[r]);
            u = __fadd_rn(u, ex.up_bias[r]);
          }
          const int slot = l.pair_slots[c0 + c];
          l.a[static_cast<size_t>(slot) * l.intermediate + r] = FloatToBf16(Glu(l.glu, g, u));
        }
      }
    }
  }
}

// h[slot, r] = a_slot . down_r (+ bias) for row r of every pair of expert blockIdx.y.
template <Fp4Kind K>
__global__ void __launch_bounds__(kWarps * 32, 4) DownKernel(ExpertLaunch l) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * kWarps + warp;
  const int D = l.in_dim, I = l.intermediate;
  if (r >= D) return;
  const DeviceExpert& ex = l.experts[blockIdx.y];
  const int groups = I / 32, spr = K == Fp4Kind::kMxfp4 ? I / 32 : I / 16;
  const uint8_t* wp = ex.down.packed + static_cast<size_t>(r) * (I / 2);
  const uint8_t* ws = ex.down.scales + static_cast<size_t>(r) * spr;
  const int p0 = l.pair_offsets[blockIdx.y], p1 = l.pair_offsets[blockIdx.y + 1];
  for (int c0 = p0; c0 < p1; c0 += kChunk) {
    const int n = min(kChunk, p1 - c0);
    float acc[kChunk];
    const uint16_t* arow[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      acc[c] = 0.0f;
      arow[c] = l.a + static_cast<size_t>(l.pair_slots[c0 + min(c, n - 1)]) * I;
    }
    for (int g0 = lane; g0 < groups; g0 += 32 * kPrefetch) {
      uint4 w[kPrefetch];
      float s0[kPrefetch], s1[kPrefetch];
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int g = g0 + 32 * i;
        if (g < groups) {
          w[i] = __ldg(reinterpret_cast<const uint4*>(wp) + g);
          GroupScales<K>(ws, g, ex.down.global_scale, &s0[i], &s1[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kPrefetch; ++i) {
        const int g = g0 + 32 * i;
        if (g >= groups) break;
#pragma unroll
        for (int c = 0; c < kChunk; ++c) {
          if (c < n) acc[c] = __fadd_rn(acc[c], GroupDot(w[i], arow[c] + g * 32, s0[i], s1[i]));
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (c < n) {
        float v = WarpSum(acc[c]);
        if (lane == 0) {
          if (ex.down_bias != nullptr) v = __fadd_rn(v, ex.down_bias[r]);
          l.h[static_cast<size_t>(l.pair_slots[c0 + c]) * D + r] = v;
        }
      }
    }
  }
}

__device__ __forceinline__ void Load8(const float* w, float* out) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w));
  const float4 b = __ldg(reinterpret_cast<const float4*>(w) + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
__device__ __forceinline__ void Load8(const uint16_t* w, float* out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(w));
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = Bf16ToFloat(u[i] & 0xFFFFu);
    out[2 * i + 1] = Bf16ToFloat(u[i] >> 16);
  }
}

template <typename W>
__global__ void __launch_bounds__(kWarps * 32)
    LinearKernel(const uint16_t* x, int tokens, const W* w, const float* bias, int rows, int cols,
                 float* out, uint16_t* out_bf16) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * kWarps + warp;
  if (r >= rows) return;
  const W* wr = w + static_cast<size_t>(r) * cols;
  for (int t0 = 0; t0 < tokens; t0 += kChunk) {
    const int n = min(kChunk, tokens - t0);
    float acc[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) acc[c] = 0.0f;
    for (int k = lane * 8; k < cols; k += 32 * 8) {
      float wf[8];
      Load8(wr + k, wf);
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        if (c < n) {
          float xf[8];
          Load8(x + static_cast<size_t>(t0 + c) * cols + k, xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[c] = fmaf(wf[i], xf[i], acc[c]);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      if (c < n) {
        float v = WarpSum(acc[c]);
        if (lane == 0) {
          if (bias != nullptr) v = __fadd_rn(v, bias[r]);
          const size_t o = static_cast<size_t>(t0 + c) * rows + r;
          out[o] = v;
          if (out_bf16 != nullptr) out_bf16[o] = FloatToBf16(v);
        }
      }
    }
  }
}

// Block-wide sum in a fixed order: each warp's butterfly, then warp 0 adds the warps in order.
__device__ float BlockSum(float v, float* scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) total = __fadd_rn(total, scratch[i]);
  __syncthreads();
  return total;
}

__global__ void CombineKernel(const float* h, const float* topk_weights, int top_k, int dim,
                              const float* norm_weight, float eps, float* y, uint16_t* y_bf16) {
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      v = __fadd_rn(v, __fmul_rn(topk_weights[t * top_k + j],
                                 h[(static_cast<size_t>(t) * top_k + j) * dim + d]));
    }
    y[static_cast<size_t>(t) * dim + d] = v;
    ss = fmaf(v, v, ss);
  }
  const float total = BlockSum(ss, scratch);
  const float denom = sqrtf(__fadd_rn(__fdiv_rn(total, static_cast<float>(dim)), eps));
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    const size_t o = static_cast<size_t>(t) * dim + d;
    float v = y[o];
    if (norm_weight != nullptr) v = __fmul_rn(__fdiv_rn(v, denom), norm_weight[d]);
    y[o] = v;
    y_bf16[o] = FloatToBf16(v);
  }
}

__global__ void GluKernel(const float* g, const float* u, int n, GluParams p, uint16_t* a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = FloatToBf16(Glu(p, g[i], u[i]));
}

__global__ void AddKernel(const float* a, const float* b, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __fadd_rn(a[i], b[i]);
}

// The larger of (value, index) pairs: higher value, then lower index.
__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// One block per token. Shared memory: s[E], b[E], taken[E], group scores.
__global__ void TopKKernel(TopKLaunch l) {
  extern __shared__ float smem[];
  const int E = l.experts, t = blockIdx.x;
  float* s = smem;
  float* b = s + E;
  float* gscore = b + E;
  int* taken = reinterpret_cast<int*>(gscore + l.n_group);
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const float* logits = l.logits + static_cast<size_t>(t) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float v = logits[e];
    if (l.softmax) {
      s[e] = b[e] = v;
    } else {
      s[e] = Sigmoid(v);
      b[e] = __fadd_rn(s[e], l.correction_bias[e]);
    }
    taken[e] = 0;
  }
  __syncthreads();
  if (l.n_group > 1) {
    const int per = E / l.n_group;
    for (int g = threadIdx.x; g < l.n_group; g += blockDim.x) {
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        if (b[e] > m1) { m2 = m1; m1 = b[e]; } else if (b[e] > m2) { m2 = b[e]; }
      }
      gscore[g] = __fadd_rn(m1, m2);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Keep the topk_group best groups (ties to the lower index); mark the rest with -inf.
      for (int k = 0; k < l.topk_group; ++k) {
        int best = -1;
        for (int g = 0; g < l.n_group; ++g) {
          if (gscore[g] == INFINITY) continue;
          if (best < 0 || Better(gscore[g], g, gscore[best], best)) best = g;
        }
        gscore[best] = INFINITY;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      if (gscore[e / per] != INFINITY) b[e] = 0.0f;
    }
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  for (int k = 0; k < l.top_k; ++k) {
    float bv = -INFINITY;
    int bi = E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      if (!taken[e] && Better(b[e], e, bv, bi)) { bv = b[e]; bi = e; }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
      if (Better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nwarps; ++w) {
        if (Better(red_v[w], red_i[w], red_v[0], red_i[0])) { red_v[0] = red_v[w]; red_i[0] = red_i[w]; }
      }
      taken[red_i[0]] = 1;
      l.ids[t * l.top_k + k] = red_i[0];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int* ids = l.ids + t * l.top_k;
    float* w = l.weights + t * l.top_k;
    float sum = 0.0f;
    if (l.softmax) {
      for (int j = 0; j < l.top_k; ++j) sum = __fadd_rn(sum, w[j] = expf(__fsub_rn(s[ids[j]], s[ids[0]])));
      for (int j = 0; j < l.top_k; ++j) w[j] = __fdiv_rn(w[j], sum);
    } else {
      for (int j = 0; j < l.top_k; ++j) sum = __fadd_rn(sum, w[j] = s[ids[j]]);
      for (int j = 0; j < l.top_k; ++j) {
        if (l.norm_topk_prob) w[j] = __fdiv_rn(w[j], __fadd_rn(sum, 1e-20f));
        w[j] = __fmul_rn(w[j], l.routed_scaling_factor);
      }
    }
  }
}

unsigned Blocks(int n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

void LaunchExperts(const ExpertLaunch& l, cudaStream_t stream) {
  if (l.num_experts == 0) return;
  const dim3 block(kWarps * 32);
  const dim3 gate_grid(Blocks(l.intermediate, kWarps), l.num_experts);
  const dim3 down_grid(Blocks(l.in_dim, kWarps), l.num_experts);
  if (l.kind == Fp4Kind::kMxfp4) {
    GateUpKernel<Fp4Kind::kMxfp4><<<gate_grid, block, 0, stream>>>(l);
    DownKernel<Fp4Kind::kMxfp4><<<down_grid, block, 0, stream>>>(l);
  } else {
    GateUpKernel<Fp4Kind::kNvfp4><<<gate_grid, block, 0, stream>>>(l);
    DownKernel<Fp4Kind::kNvfp4><<<down_grid, block, 0, stream>>>(l);
  }
}

void LaunchCombine(const float* h, const float* topk_weights, int tokens, int top_k, int dim,
                   const float* norm_weight, float eps, float* y, uint16_t* y_bf16,
                   cudaStream_t stream) {
  CombineKernel<<<tokens, 256, 0, stream>>>(h, topk_weights, top_k, dim, norm_weight, eps, y,
                                            y_bf16);
}

void LaunchLinearF32(const uint16_t* x, int tokens, const float* w, const float* bias, int rows,
                     int cols, float* out, uint16_t* out_bf16, cudaStream_t stream) {
  LinearKernel<float><<<Blocks(rows, kWarps), kWarps * 32, 0, stream>>>(x, tokens, w, bias, rows,
                                                                       cols, out, out_bf16);
}

void LaunchLinearBF16(const uint16_t* x, int tokens, const uint16_t* w, const float* bias,
                      int rows, int cols, float* out, uint16_t* out_bf16, cudaStream_t stream) {
  LinearKernel<uint16_t><<<Blocks(rows, kWarps), kWarps * 32, 0, stream>>>(
      x, tokens, w, bias, rows, cols, out, out_bf16);
}

void LaunchGlu(const float* g, const float* u, int n, GluParams glu, uint16_t* a,
               cudaStream_t stream) {
  GluKernel<<<Blocks(n, 256), 256, 0, stream>>>(g, u, n, glu, a);
}

void LaunchTopK(const TopKLaunch& l, cudaStream_t stream) {
  const size_t smem = (2 * static_cast<size_t>(l.experts) + l.n_group) * sizeof(float) +
                      static_cast<size_t>(l.experts) * sizeof(int);
  TopKKernel<<<l.tokens, 256, smem, stream>>>(l);
}

void LaunchAdd(const float* a, const float* b, int n, float* out, cudaStream_t stream) {
  AddKernel<<<Blocks(n, 256), 256, 0, stream>>>(a, b, n, out);
}

}  // namespace ckpt::gpu
