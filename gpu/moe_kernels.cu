// CUDA kernels of the MoE block forward; the contract is in moe_kernels.h. Rounding is spelled
// out with __fmul_rn/__fadd_rn/fmaf wherever a contraction could change bits between builds.
#include <cuda_bf16.h>

#include "gpu/moe_kernels.h"

namespace ckpt::gpu {
namespace {

constexpr int kWarps = 8;  // warps per block of the dense GEMVs; a warp owns one output row
constexpr int kChunk = 2;  // tokens whose accumulators a lane of a dense GEMV holds at once

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

// ---- Expert GEMVs on BF16 tensor cores (mma.sync m16n8k16, FP32 accumulation) ----------------
//
// A warp owns 16 weight rows (the MMA's A rows: lane/4 and lane/4 + 8) and walks the input
// dimension in 128-element segments. In a segment, quad lane c (lane % 4) loads 16 bytes of each
// of its two rows: elements 32c..32c+31, i.e. the two 16-element blocks 2c and 2c+1. Eight MMAs
// cover the segment; MMA (h, q) takes from every lane 4 codes of its block 2c + h. The B operand
// (activations, 16 x 8) keeps the blocks apart: its column n = 2c' + t holds token t's
// activations only in the k positions that quad lane c' supplies, zeros elsewhere. So output
// column 2c' + t of the four MMAs of one h is the exact-product, FP32-accumulated dot product of
// block 2c' + h with token t, which is then scaled by that block's scale in FP32 (fmaf). Two
// tokens per pass; the 16-element block dots never mix blocks, so a block scale multiplies
// exactly one block's sum, as in the scalar definition.
constexpr int kExpertWarps = 4;               // warps per block of the expert kernels
constexpr int kRowsPerWarp = 16;
constexpr int kSegment = 128;                 // input elements per warp step
constexpr int kPassTokens = 2;                // token columns per pass (B columns 2c' + t)
constexpr int kDepth = 2;                     // segments whose loads are in flight ahead of use
// Blocks per SM the register allocation must allow (caps of 128 and 85 registers); on the H200,
// 5 gate/up blocks (spills) and 8 down blocks were not faster (docs/PERFORMANCE.md).
constexpr int kGateUpBlocksPerSm = 4;
constexpr int kDownBlocksPerSm = 6;

// Codes j and j + 4 of the 8 in `w` (nibble i = element i) as BF16 x 2, each 2^-126 times the
// E2M1 value: the multiply copies the nibble to bits 6..9 and 12..15, the mask keeps the
// magnitude at bits 8..6 (exponent LSBs + first mantissa bit; code 1 = 0.5 becomes a subnormal)
// and the sign at bit 15. `Rescale` multiplies by 2^126 (exact in BF16 for every code).
template <int J>
__device__ __forceinline__ uint32_t E2M1PairBf16Scaled(uint32_t w) {
  const uint32_t v = J >= 2 ? w >> 8 : w;
  const uint32_t lanes = (J & 1) ? 0x00F000F0u : 0x000F000Fu;
  const uint32_t spread = (J & 1) ? 0x104u : 0x1040u;
  return ((v & lanes) * spread) & 0x81C081C0u;
}
__device__ __forceinline__ uint32_t Rescale(uint32_t v) {
  uint32_t r;
  // 2^126 = 0x7E80 in both halves; -0 addend keeps every product exact (no rounding occurs).
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x7E807E80u), "r"(0x80008000u));
  return r;
}
template <int J>
__device__ __forceinline__ uint32_t E2M1PairBf16(uint32_t w) {
  return Rescale(E2M1PairBf16Scaled<J>(w));
}

__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The scale value of a scale byte: 2^(s-127) (MXFP4) or E4M3/global, E4M3*global for a
// ModelOpt multiplier (NVFP4), one table of 256 floats per matrix in shared memory so that the
// correctly rounded division or product happens once per value.
template <Fp4Kind K>
__device__ __forceinline__ float ScaleValue(uint32_t b, const DeviceFp4& m) {
  if constexpr (K == Fp4Kind::kMxfp4) {
    return E8M0(b);
  } else {
    return m.global_multiplies ? __fmul_rn(E4M3(b), m.global_scale)
                               : __fdiv_rn(E4M3(b), m.global_scale);
  }
}

// One matrix's data for one segment of a lane: 16 bytes of each of its rows (g, g + 8) and the
// scale bytes of its blocks 2c and 2c + 1 of those rows (MXFP4: one 32-element group).
struct SegmentData {
  uint4 w0, w1;
  uint32_t s0, s1;  // byte h (h = 0, 1) is block 2c + h's scale, for row g and row g + 8
};

// 16 bytes of FP4 codes, read-only path; the L2::256B hint makes a miss fetch the aligned 256
// bytes containing them (4 segments of the row): deeper prefetch at no register cost.
__device__ __forceinline__ uint4 LoadWeights(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <Fp4Kind K>
__device__ __forceinline__ SegmentData LoadSegment(const uint8_t* row0, const uint8_t* row8,
                                                   const uint8_t* srow0, const uint8_t* srow8,
                                                   int seg, int c, int dim) {
  SegmentData d{};
  if (seg * kSegment + 32 * c < dim) {
    const size_t at = static_cast<size_t>(seg) * (kSegment / 2) + 16 * c;
    d.w0 = LoadWeights(row0 + at);
    d.w1 = LoadWeights(row8 + at);
    if constexpr (K == Fp4Kind::kMxfp4) {
      const int g = seg * (kSegment / 32) + c;
      d.s0 = __ldg(srow0 + g) * 0x101u;
      d.s1 = __ldg(srow8 + g) * 0x101u;
    } else {
      const int b = seg * (kSegment / 16) + 2 * c;
      d.s0 = __ldg(srow0 + b) | (static_cast<uint32_t>(__ldg(srow0 + b + 1)) << 8);
      d.s1 = __ldg(srow8 + b) | (static_cast<uint32_t>(__ldg(srow8 + b + 1)) << 8);
    }
  }
  return d;
}

// The four MMAs of half h of a segment: acc += A(h) x B; `x` = this lane's 4 x 16 bytes of B.
template <int H>
__device__ __forceinline__ void SegmentHalf(const SegmentData& d, const uint4 (&x)[4],
                                            float (&c)[4]) {
  const uint32_t r0[4] = {d.w0.x, d.w0.y, d.w0.z, d.w0.w};
  const uint32_t r8[4] = {d.w1.x, d.w1.y, d.w1.z, d.w1.w};
#pragma unroll
  for (int wi = 2 * H; wi < 2 * H + 2; ++wi) {
    Mma(c, E2M1PairBf16<0>(r0[wi]), E2M1PairBf16<0>(r8[wi]), E2M1PairBf16<1>(r0[wi]),
        E2M1PairBf16<1>(r8[wi]), x[wi].x, x[wi].y);
    Mma(c, E2M1PairBf16<2>(r0[wi]), E2M1PairBf16<2>(r8[wi]), E2M1PairBf16<3>(r0[wi]),
        E2M1PairBf16<3>(r8[wi]), x[wi].z, x[wi].w);
  }
}

// acc[i] += block dot * block scale; c[0], c[1]: row g (tokens 0, 1); c[2], c[3]: row g + 8.
template <int H>
__device__ __forceinline__ void ApplyScales(const SegmentData& d, const float* table,
                                            const float (&c)[4], float (&acc)[4]) {
  const float s0 = table[(d.s0 >> (8 * H)) & 0xFFu], s1 = table[(d.s1 >> (8 * H)) & 0xFFu];
  acc[0] = fmaf(c[0], s0, acc[0]);
  acc[1] = fmaf(c[1], s0, acc[1]);
  acc[2] = fmaf(c[2], s1, acc[2]);
  acc[3] = fmaf(c[3], s1, acc[3]);
}

template <Fp4Kind K>
__device__ __forceinline__ void SegmentStep(const SegmentData& d, const uint4 (&x)[4],
                                            const float* table, float (&acc)[4]) {
  float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  SegmentHalf<0>(d, x, c0);
  SegmentHalf<1>(d, x, c1);
  ApplyScales<0>(d, table, c0, acc);
  ApplyScales<1>(d, table, c1, acc);
}

// Shared memory of the expert kernels: the pass's activations in B order, 64 zero bytes (the B
// source of lanes whose column is zero at their k positions), and the scale tables.
struct ExpertSmem {
  uint16_t* x;     // [kPassTokens][padded]: within every 8 elements, order 0 4 1 5 2 6 3 7
  uint4* zeros;    // [4]
  float* tables;   // [matrices][256]
};
__host__ __device__ __forceinline__ int Padded(int dim) {
  return (dim + kSegment - 1) / kSegment * kSegment;
}
size_t ExpertSmemBytes(int dim, int matrices) {
  return static_cast<size_t>(kPassTokens) * Padded(dim) * 2 + 64 +
         static_cast<size_t>(matrices) * 256 * sizeof(float);
}
__device__ __forceinline__ ExpertSmem CarveSmem(int dim, int matrices) {
  extern __shared__ uint4 expert_smem[];
  ExpertSmem s;
  s.x = reinterpret_cast<uint16_t*>(expert_smem);
  s.zeros = expert_smem + kPassTokens * Padded(dim) / 8;
  s.tables = reinterpret_cast<float*>(s.zeros + 4);
  return s;
}

// Stage the pass's activation rows (BF16, `dim` wide; null = absent token) in B order, zero
// padded to whole segments.
__device__ __forceinline__ void StageActivations(const ExpertSmem& s,
                                                 const uint16_t* const (&rows)[kPassTokens],
                                                 int dim) {
  const int groups = Padded(dim) / 8;
  uint4* out = reinterpret_cast<uint4*>(s.x);
  for (int i = threadIdx.x; i < kPassTokens * groups; i += blockDim.x) {
    const int t = i / groups, g = i % groups;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    const uint16_t* row = t == 0 ? rows[0] : rows[1];
    if (row != nullptr && g * 8 < dim) {
      const uint4 e = __ldg(reinterpret_cast<const uint4*>(row) + g);
      v = make_uint4(__byte_perm(e.x, e.z, 0x5410), __byte_perm(e.x, e.z, 0x7632),
                     __byte_perm(e.y, e.w, 0x5410), __byte_perm(e.y, e.w, 0x7632));
    }
    out[i] = v;
  }
}

// This lane's B source: its column n = lane / 4 = 2c' + t is non-zero only where c' = lane % 4.
__device__ __forceinline__ const uint4* BSource(const ExpertSmem& s, int dim, int lane, int* step) {
  const int g = lane / 4, c = lane % 4;
  if (c == g / 2) {
    *step = kSegment / 8;
    return reinterpret_cast<const uint4*>(s.x + static_cast<size_t>(g % 2) * Padded(dim)) + 4 * c;
  }
  *step = 0;
  return s.zeros;
}

__device__ __forceinline__ void LoadB(const uint4* src, uint4 (&x)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = src[i];
}

// Sum over the quad (lanes c = 0..3 hold blocks 2c, 2c + 1 of each segment), xor 1 then xor 2.
__device__ __forceinline__ float QuadSum(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// After QuadSum every quad lane holds all four results; lane c keeps result c:
// row g + 8 * (c / 2), token c % 2.
__device__ __forceinline__ float Pick(const float (&acc)[4], int c) {
  return c == 0 ? acc[0] : c == 1 ? acc[1] : c == 2 ? acc[2] : acc[3];
}

// The expert GEMVs of expert blockIdx.y for all its pairs, two tokens per pass. Gate/up
// (kGateUp): a[slot, r] = BF16(GLU(z_t . gate_r (+ bias), z_t . up_r (+ bias))); down:
// h[slot, r] = a_slot . down_r (+ bias). Each of the kExpertWarps warps of a block owns a 16-row
// tile over the whole input width; the block shares the staged activations and scale tables.
template <Fp4Kind K, bool kGateUp>
__global__ void __launch_bounds__(kExpertWarps * 32, kGateUp ? kGateUpBlocksPerSm : kDownBlocksPerSm)
    ExpertKernel(ExpertLaunch l) {
  constexpr int M = kGateUp ? 2 : 1;  // matrices: gate, up | down
  const int in = kGateUp ? l.in_dim : l.intermediate;
  const int out_rows = kGateUp ? l.intermediate : l.in_dim;
  const ExpertSmem s = CarveSmem(in, M);
  const DeviceExpert& ex = l.experts[blockIdx.y];
  const DeviceFp4* mat[2] = {kGateUp ? &ex.gate : &ex.down, &ex.up};
  for (int i = threadIdx.x; i < 256 * M; i += blockDim.x) {
    s.tables[i] = ScaleValue<K>(i & 255, *(i < 256 ? mat[0] : mat[1]));
  }
  if (threadIdx.x < 4) s.zeros[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int r0 = (blockIdx.x * kExpertWarps + warp) * kRowsPerWarp;
  const bool active = r0 < out_rows;
  const int segs = Padded(in) / kSegment;
  const int spr = K == Fp4Kind::kMxfp4 ? in / 32 : in / 16;
  const size_t ra = active ? r0 + g : 0, rb = active ? r0 + g + 8 : 0;
  const uint8_t *p0[M], *p8[M], *s0[M], *s8[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    p0[m] = mat[m]->packed + ra * (in / 2);
    p8[m] = mat[m]->packed + rb * (in / 2);
    s0[m] = mat[m]->scales + ra * spr;
    s8[m] = mat[m]->scales + rb * spr;
  }
  int bstep;
  const uint4* bsrc = BSource(s, in, lane, &bstep);
  const int q0 = l.pair_offsets[blockIdx.y], q1 = l.pair_offsets[blockIdx.y + 1];
  for (int c0 = q0; c0 < q1; c0 += kPassTokens) {
    const int n = min(kPassTokens, q1 - c0);
    const uint16_t* rows[kPassTokens];
#pragma unroll
    for (int t = 0; t < kPassTokens; ++t) {
      const int slot = l.pair_slots[c0 + min(t, n - 1)];
      rows[t] = t >= n     ? nullptr
                : kGateUp ? l.z + static_cast<size_t>(slot / l.top_k) * in
                          : l.a + static_cast<size_t>(slot) * in;
    }
    __syncthreads();  // the previous pass is done with s.x
    StageActivations(s, rows, in);
    __syncthreads();
    if (!active) continue;
    float v[M];
    {
      float acc[M][4];
      SegmentData q[M][kDepth];
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][i] = 0.0f;
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          q[m][d] = d < segs ? LoadSegment<K>(p0[m], p8[m], s0[m], s8[m], d, c, in) : SegmentData{};
        }
      }
      for (int seg = 0; seg < segs; ++seg) {
        SegmentData cur[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {  // keep kDepth segments' loads in flight
          cur[m] = q[m][0];
#pragma unroll
          for (int d = 0; d + 1 < kDepth; ++d) q[m][d] = q[m][d + 1];
          q[m][kDepth - 1] = seg + kDepth < segs
                                 ? LoadSegment<K>(p0[m], p8[m], s0[m], s8[m], seg + kDepth, c, in)
                                 : SegmentData{};
        }
        uint4 x[4];
        LoadB(bsrc + seg * bstep, x);
#pragma unroll
        for (int m = 0; m < M; ++m) SegmentStep<K>(cur[m], x, s.tables + 256 * m, acc[m]);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][i] = QuadSum(acc[m][i]);
        v[m] = Pick(acc[m], c);
      }
    }
    if (c % 2 < n) {
      const int r = r0 + g + 8 * (c / 2);
      const int slot = l.pair_slots[c0 + c % 2];
      if constexpr (kGateUp) {
        float gv = v[0], uv = v[1];
        if (ex.gate_bias != nullptr) {
          gv = __fadd_rn(gv, ex.gate_bias[r]);
          uv = __fadd_rn(uv, ex.up_bias[r]);
        }
        l.a[static_cast<size_t>(slot) * l.intermediate + r] = FloatToBf16(Glu(l.glu, gv, uv));
      } else {
        float hv = v[0];
        if (ex.down_bias != nullptr) hv = __fadd_rn(hv, ex.down_bias[r]);
        l.h[static_cast<size_t>(slot) * l.in_dim + r] = hv;
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

// One block per token. The top-k terms of an element are loaded 8 at a time before they are
// added (j ascending), so a thread waits for one round of loads per 8 terms, not per term.
constexpr int kCombineThreads = 1024;
constexpr int kCombineBatch = 8;
__global__ void __launch_bounds__(kCombineThreads)
    CombineKernel(const float* h, const float* topk_weights, int top_k, int dim,
                  const float* norm_weight, float eps, float* y, uint16_t* y_bf16) {
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  const float* wt = topk_weights + static_cast<size_t>(t) * top_k;
  const float* ht = h + static_cast<size_t>(t) * top_k * dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = 0.0f;
    for (int j0 = 0; j0 < top_k; j0 += kCombineBatch) {
      float wv[kCombineBatch], hv[kCombineBatch];
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        if (j0 + i < top_k) {
          wv[i] = wt[j0 + i];
          hv[i] = ht[static_cast<size_t>(j0 + i) * dim + d];
        }
      }
#pragma unroll
      for (int i = 0; i < kCombineBatch; ++i) {
        if (j0 + i < top_k) v = __fadd_rn(v, __fmul_rn(wv[i], hv[i]));
      }
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


template <Fp4Kind K>
void LaunchExpertKernels(const ExpertLaunch& l, cudaStream_t stream) {
  const dim3 block(kExpertWarps * 32);
  const int rows_per_block = kExpertWarps * kRowsPerWarp;
  const dim3 gate_grid(Blocks(l.intermediate, rows_per_block), l.num_experts);
  const dim3 down_grid(Blocks(l.in_dim, rows_per_block), l.num_experts);
  const size_t gate_smem = ExpertSmemBytes(l.in_dim, 2), down_smem = ExpertSmemBytes(l.intermediate, 1);
  // Above 48 KiB (widths over ~11k) a kernel must opt in to more dynamic shared memory.
  if (gate_smem > 48 * 1024) {
    cudaFuncSetAttribute(ExpertKernel<K, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(gate_smem));
  }
  if (down_smem > 48 * 1024) {
    cudaFuncSetAttribute(ExpertKernel<K, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(down_smem));
  }
  ExpertKernel<K, true><<<gate_grid, block, gate_smem, stream>>>(l);
  ExpertKernel<K, false><<<down_grid, block, down_smem, stream>>>(l);
}

}  // namespace

void LaunchExperts(const ExpertLaunch& l, cudaStream_t stream) {
  if (l.num_experts == 0) return;
  if (l.kind == Fp4Kind::kMxfp4) {
    LaunchExpertKernels<Fp4Kind::kMxfp4>(l, stream);
  } else {
    LaunchExpertKernels<Fp4Kind::kNvfp4>(l, stream);
  }
}

void LaunchCombine(const float* h, const float* topk_weights, int tokens, int top_k, int dim,
                   const float* norm_weight, float eps, float* y, uint16_t* y_bf16,
                   cudaStream_t stream) {
  CombineKernel<<<tokens, kCombineThreads, 0, stream>>>(h, topk_weights, top_k, dim, norm_weight,
                                                        eps, y, y_bf16);
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
