// Kimi-K3-sized routed-expert stage on the GPU: our W4A16 kernels (gpu/moe_kernels.h) at T = 2
// and T = 32 tokens, against the HBM time for the FP4 bytes of the selected experts (copy
// bandwidth measured in the same run). Weights are random bytes generated on the device. Prints
// one JSON object (with the routing used, so the torch eager reference can replay it).
//
// Then a whole-model run (MXFP4): `--layers` layers, each with its own random routing, whose
// selected experts are streamed from pinned host memory by gpu/expert_stream.h with the expert
// kernels and the combine overlapped, against a same-run baseline that only copies the same
// experts' bytes from pinned host memory to the GPU (docs/PERFORMANCE.md "Block forward").
//
//   moe_bench [--iters N] [--layers L] > bench.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <chrono>

#include "gpu/expert_stream.h"
#include "gpu/moe_kernels.h"

namespace {

constexpr int kLatent = 3584, kInter = 3072, kExperts = 896, kTopK = 16, kHidden = 7168;

#define CHECK(expr)                                                                 \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));              \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

__global__ void FillBytes(uint8_t* p, size_t n, uint64_t seed, uint32_t lo, uint32_t span) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = static_cast<uint8_t>(lo + static_cast<uint32_t>(z % span));
  }
}

void Fill(uint8_t* p, size_t n, uint64_t seed, uint32_t lo, uint32_t span) {
  FillBytes<<<4096, 256>>>(p, n, seed, lo, span);
  CHECK(cudaGetLastError());
}

struct Weights {
  ckpt::gpu::Fp4Kind kind;
  uint8_t* packed = nullptr;  // [3][E][rows * cols / 2]: gate, up, down
  uint8_t* scales = nullptr;  // [3][E][rows * cols / group]
  size_t packed_per = 0, scales_per = 0;
  ckpt::gpu::DeviceExpert Expert(int e) const {
    ckpt::gpu::DeviceExpert d;
    ckpt::gpu::DeviceFp4* m[3] = {&d.gate, &d.up, &d.down};
    for (int k = 0; k < 3; ++k) {
      m[k]->packed = packed + (static_cast<size_t>(k) * kExperts + e) * packed_per;
      m[k]->scales = scales + (static_cast<size_t>(k) * kExperts + e) * scales_per;
      m[k]->global_scale = 1.0f;
    }
    return d;
  }
  size_t ExpertBytes() const { return 3 * (packed_per + scales_per); }
};

Weights MakeWeights(ckpt::gpu::Fp4Kind kind) {
  Weights w;
  w.kind = kind;
  const size_t elems = static_cast<size_t>(kLatent) * kInter;  // same for gate/up/down
  w.packed_per = elems / 2;
  w.scales_per = elems / (kind == ckpt::gpu::Fp4Kind::kMxfp4 ? 32 : 16);
  CHECK(cudaMalloc(&w.packed, 3 * kExperts * w.packed_per));
  CHECK(cudaMalloc(&w.scales, 3 * kExperts * w.scales_per));
  Fill(w.packed, 3 * kExperts * w.packed_per, 1, 0, 256);
  if (kind == ckpt::gpu::Fp4Kind::kMxfp4) {
    Fill(w.scales, 3 * kExperts * w.scales_per, 2, 118, 8);  // 2^-9 .. 2^-2
  } else {
    Fill(w.scales, 3 * kExperts * w.scales_per, 2, 0x08, 0x30);  // E4M3 2^-6 .. ~2^-1
  }
  return w;
}

float MedianMs(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written.
double CopyBandwidth() {
  const size_t n = size_t{4} << 30;
  void *a, *b;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  CHECK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    cudaEventRecord(e0);
    CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / (MedianMs(ms) * 1e-3);
}

struct Routing {
  std::vector<int> ids;        // [T, K]
  std::vector<float> weights;  // [T, K]
};

Routing RandomRouting(int tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Routing r;
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> all(kExperts);
    for (int e = 0; e < kExperts; ++e) all[e] = e;
    for (int j = 0; j < kTopK; ++j) {
      std::swap(all[j], all[j + rng() % (kExperts - j)]);
      r.ids.push_back(all[j]);
      r.weights.push_back(static_cast<float>(1 + rng() % 8) / 32.0f);
    }
  }
  return r;
}

std::string IdsJson(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

double WallMs(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The whole-model streaming run; prints the "model_stream" JSON member.
void ModelStream(int layers) {
  Weights dev = MakeWeights(ckpt::gpu::Fp4Kind::kMxfp4);
  const size_t packed_total = 3 * kExperts * dev.packed_per, scales_total = 3 * kExperts * dev.scales_per;
  uint8_t *host_packed, *host_scales;
  CHECK(cudaHostAlloc(&host_packed, packed_total, cudaHostAllocDefault));
  CHECK(cudaHostAlloc(&host_scales, scales_total, cudaHostAllocDefault));
  CHECK(cudaMemcpy(host_packed, dev.packed, packed_total, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(host_scales, dev.scales, scales_total, cudaMemcpyDeviceToHost));
  cudaFree(dev.packed);
  cudaFree(dev.scales);
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  std::printf(",\n  \"model_stream\": {\"layers\": %d, \"format\": \"mxfp4\", \"source\": "
              "\"pinned host memory\", \"runs\": [\n", layers);
  bool first = true;
  for (int tokens : {2, 32}) {
    struct Layer {
      std::vector<ckpt::gpu::HostExpert> experts;
      int* offsets = nullptr;
      int* slots = nullptr;
    };
    std::vector<Layer> ls(layers);
    size_t max_bytes = 0;
    double bytes = 0;
    for (int l = 0; l < layers; ++l) {
      const Routing r = RandomRouting(tokens, 5000 + 100 * l + tokens);
      std::map<int, std::vector<int>> slots_of;
      for (int i = 0; i < tokens * kTopK; ++i) slots_of[r.ids[i]].push_back(i);
      std::vector<int> offsets = {0}, slots;
      size_t layer_bytes = 0;
      for (const auto& [e, s] : slots_of) {
        ckpt::gpu::HostExpert h;
        ckpt::gpu::HostFp4* m[3] = {&h.gate, &h.up, &h.down};
        for (int k = 0; k < 3; ++k) {
          const size_t idx = static_cast<size_t>(k) * kExperts + e;
          *m[k] = {host_packed + idx * dev.packed_per, dev.packed_per,
                   host_scales + idx * dev.scales_per, dev.scales_per, 1.0f};
          layer_bytes += dev.packed_per + dev.scales_per;
        }
        ls[l].experts.push_back(h);
        slots.insert(slots.end(), s.begin(), s.end());
        offsets.push_back(static_cast<int>(slots.size()));
      }
      max_bytes = std::max(max_bytes, layer_bytes);
      bytes += static_cast<double>(layer_bytes);
      CHECK(cudaMalloc(&ls[l].offsets, offsets.size() * sizeof(int)));
      CHECK(cudaMalloc(&ls[l].slots, slots.size() * sizeof(int)));
      CHECK(cudaMemcpy(ls[l].offsets, offsets.data(), offsets.size() * sizeof(int), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(ls[l].slots, slots.data(), slots.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    uint16_t *z, *a, *yb;
    float *h, *y, *tw, *norm;
    uint8_t* copy_dst;
    CHECK(cudaMalloc(&z, sizeof(uint16_t) * tokens * kLatent));
    CHECK(cudaMalloc(&a, sizeof(uint16_t) * tokens * kTopK * kInter));
    CHECK(cudaMalloc(&h, sizeof(float) * tokens * kTopK * kLatent));
    CHECK(cudaMalloc(&y, sizeof(float) * tokens * kLatent));
    CHECK(cudaMalloc(&yb, sizeof(uint16_t) * tokens * kLatent));
    CHECK(cudaMalloc(&tw, sizeof(float) * tokens * kTopK));
    CHECK(cudaMalloc(&norm, sizeof(float) * kLatent));
    CHECK(cudaMalloc(&copy_dst, max_bytes));
    CHECK(cudaMemset(z, 0, sizeof(uint16_t) * tokens * kLatent));
    CHECK(cudaMemset(tw, 0, sizeof(float) * tokens * kTopK));
    CHECK(cudaMemset(norm, 0, sizeof(float) * kLatent));
    ckpt::gpu::ExpertStreamer streamer;
    auto ours = [&] {
      for (Layer& l : ls) {
        ckpt::gpu::ExpertLaunch el;
        el.kind = ckpt::gpu::Fp4Kind::kMxfp4;
        el.in_dim = kLatent;
        el.intermediate = kInter;
        el.top_k = kTopK;
        el.num_experts = static_cast<int>(l.experts.size());
        el.pair_offsets = l.offsets;
        el.pair_slots = l.slots;
        el.z = z;
        el.a = a;
        el.h = h;
        absl::Status s = streamer.Run(l.experts, el, stream);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          std::exit(2);
        }
        ckpt::gpu::LaunchCombine(h, tw, tokens, kTopK, kLatent, norm, 1e-6f, y, yb, stream);
      }
      CHECK(cudaStreamSynchronize(stream));
    };
    auto copy_only = [&] {
      for (Layer& l : ls) {
        size_t at = 0;
        for (const ckpt::gpu::HostExpert& e : l.experts) {
          for (const ckpt::gpu::HostFp4* m : {&e.gate, &e.up, &e.down}) {
            CHECK(cudaMemcpyAsync(copy_dst + at, m->packed, m->packed_bytes, cudaMemcpyHostToDevice, stream));
            at += m->packed_bytes;
            CHECK(cudaMemcpyAsync(copy_dst + at, m->scales, m->scale_bytes, cudaMemcpyHostToDevice, stream));
            at += m->scale_bytes;
          }
        }
      }
      CHECK(cudaStreamSynchronize(stream));
    };
    ours();
    copy_only();
    std::vector<float> ours_ms, copy_ms;
    for (int i = 0; i < 3; ++i) {
      ours_ms.push_back(static_cast<float>(WallMs(ours)));
      copy_ms.push_back(static_cast<float>(WallMs(copy_only)));
    }
    const double o = MedianMs(ours_ms), c = MedianMs(copy_ms);
    std::printf("%s    {\"tokens\": %d, \"expert_bytes_all_layers\": %.0f, \"ours_wall_ms\": \"%.2f\", "
                "\"copy_only_wall_ms\": \"%.2f\", \"ratio\": \"%.3f\", \"copy_bytes_per_s\": \"%.4g\", "
                "\"chunks_last_layer\": %d}",
                first ? "" : ",\n", tokens, bytes, o, c, o / c, bytes / (c * 1e-3), streamer.chunks());
    first = false;
    for (Layer& l : ls) {
      cudaFree(l.offsets);
      cudaFree(l.slots);
    }
    for (void* p : {static_cast<void*>(z), static_cast<void*>(a), static_cast<void*>(h),
                    static_cast<void*>(y), static_cast<void*>(yb), static_cast<void*>(tw),
                    static_cast<void*>(norm), static_cast<void*>(copy_dst)}) {
      cudaFree(p);
    }
  }
  std::printf("\n  ]}");
  cudaStreamDestroy(stream);
  cudaFreeHost(host_packed);
  cudaFreeHost(host_scales);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, layers = 8;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--layers") == 0) layers = std::atoi(argv[i + 1]);
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const double bw = CopyBandwidth();
  std::printf("{\n  \"device\": \"%s\",\n  \"copy_bandwidth_bytes_per_s\": \"%.4g\",\n", prop.name,
              bw);
  std::printf("  \"shape\": {\"hidden\": %d, \"latent\": %d, \"intermediate\": %d, \"experts\": %d, "
              "\"top_k\": %d},\n  \"iters\": %d,\n  \"runs\": [\n",
              kHidden, kLatent, kInter, kExperts, kTopK, iters);
  bool first = true;
  for (ckpt::gpu::Fp4Kind kind : {ckpt::gpu::Fp4Kind::kMxfp4, ckpt::gpu::Fp4Kind::kNvfp4}) {
    Weights w = MakeWeights(kind);
    for (int tokens : {2, 32}) {
      const Routing r = RandomRouting(tokens, 1000 + tokens);
      std::map<int, std::vector<int>> slots_of;
      for (int i = 0; i < tokens * kTopK; ++i) slots_of[r.ids[i]].push_back(i);
      std::vector<ckpt::gpu::DeviceExpert> table;
      std::vector<int> offsets = {0}, slots;
      for (const auto& [e, s] : slots_of) {
        table.push_back(w.Expert(e));
        slots.insert(slots.end(), s.begin(), s.end());
        offsets.push_back(static_cast<int>(slots.size()));
      }
      ckpt::gpu::DeviceExpert* dtable;
      int *doff, *dslots;
      uint16_t *z, *a, *yb;
      float *h, *y, *tw, *norm;
      CHECK(cudaMalloc(&dtable, table.size() * sizeof(table[0])));
      CHECK(cudaMalloc(&doff, offsets.size() * sizeof(int)));
      CHECK(cudaMalloc(&dslots, slots.size() * sizeof(int)));
      CHECK(cudaMalloc(&z, sizeof(uint16_t) * tokens * kLatent));
      CHECK(cudaMalloc(&a, sizeof(uint16_t) * tokens * kTopK * kInter));
      CHECK(cudaMalloc(&h, sizeof(float) * tokens * kTopK * kLatent));
      CHECK(cudaMalloc(&y, sizeof(float) * tokens * kLatent));
      CHECK(cudaMalloc(&yb, sizeof(uint16_t) * tokens * kLatent));
      CHECK(cudaMalloc(&tw, sizeof(float) * tokens * kTopK));
      CHECK(cudaMalloc(&norm, sizeof(float) * kLatent));
      CHECK(cudaMemcpy(dtable, table.data(), table.size() * sizeof(table[0]), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(doff, offsets.data(), offsets.size() * sizeof(int), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(dslots, slots.data(), slots.size() * sizeof(int), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(tw, r.weights.data(), r.weights.size() * sizeof(float), cudaMemcpyHostToDevice));
      // z: BF16 values in [1/64, 1) with random signs (0x3C80..0x3F7F | sign).
      Fill(reinterpret_cast<uint8_t*>(z), sizeof(uint16_t) * tokens * kLatent, 3, 0, 256);
      std::vector<uint16_t> zh(static_cast<size_t>(tokens) * kLatent);
      CHECK(cudaMemcpy(zh.data(), z, zh.size() * 2, cudaMemcpyDeviceToHost));
      for (uint16_t& v : zh) v = static_cast<uint16_t>((v & 0x8000) | (0x3C80 + (v % 0x2FF)));
      CHECK(cudaMemcpy(z, zh.data(), zh.size() * 2, cudaMemcpyHostToDevice));
      std::vector<float> ones(kLatent, 1.0f);
      CHECK(cudaMemcpy(norm, ones.data(), kLatent * sizeof(float), cudaMemcpyHostToDevice));

      ckpt::gpu::ExpertLaunch l;
      l.kind = kind;
      l.in_dim = kLatent;
      l.intermediate = kInter;
      l.top_k = kTopK;
      l.num_experts = static_cast<int>(table.size());
      l.experts = dtable;
      l.pair_offsets = doff;
      l.pair_slots = dslots;
      l.z = z;
      l.a = a;
      l.h = h;
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> ms;
      std::vector<float> out_first, out;
      for (int i = 0; i < iters + 3; ++i) {
        cudaEventRecord(e0);
        ckpt::gpu::LaunchExperts(l, nullptr);
        ckpt::gpu::LaunchCombine(h, tw, tokens, kTopK, kLatent, norm, 1e-6f, y, yb, nullptr);
        cudaEventRecord(e1);
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaGetLastError());
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 3) ms.push_back(t);
        out.resize(static_cast<size_t>(tokens) * kLatent);
        CHECK(cudaMemcpy(out.data(), y, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
        if (i == 0) out_first = out;
      }
      const bool deterministic = std::memcmp(out.data(), out_first.data(), out.size() * 4) == 0;
      const double bytes = static_cast<double>(table.size()) * w.ExpertBytes();
      const double ours_ms = MedianMs(ms);
      const double floor_ms = bytes / bw * 1e3;
      std::printf("%s    {\"format\": \"%s\", \"tokens\": %d, \"distinct_experts\": %zu, "
                  "\"expert_bytes\": %.0f, \"ours_ms\": \"%.4f\", \"hbm_floor_ms\": \"%.4f\", "
                  "\"fraction_of_hbm_floor\": \"%.3f\", \"effective_bytes_per_s\": \"%.4g\", "
                  "\"bitwise_deterministic_over_runs\": %s, \"routing_ids\": %s, "
                  "\"routing_weights_x32\": %s}",
                  first ? "" : ",\n", kind == ckpt::gpu::Fp4Kind::kMxfp4 ? "mxfp4" : "nvfp4",
                  tokens, table.size(), bytes, ours_ms, floor_ms, floor_ms / ours_ms,
                  bytes / (ours_ms * 1e-3), deterministic ? "true" : "false",
                  IdsJson(r.ids).c_str(), [&] {
                    std::vector<int> w32;
                    for (float f : r.weights) w32.push_back(static_cast<int>(f * 32));
                    return IdsJson(w32);
                  }().c_str());
      first = false;
      for (void* p : {static_cast<void*>(dtable), static_cast<void*>(doff),
                      static_cast<void*>(dslots), static_cast<void*>(z), static_cast<void*>(a),
                      static_cast<void*>(h), static_cast<void*>(y), static_cast<void*>(yb),
                      static_cast<void*>(tw), static_cast<void*>(norm)}) {
        cudaFree(p);
      }
    }
    cudaFree(w.packed);
    cudaFree(w.scales);
  }
  std::printf("\n  ]");
  if (layers > 0) ModelStream(layers);
  std::printf("\n}\n");
  return 0;
}
