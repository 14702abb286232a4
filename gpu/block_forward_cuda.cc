#include "gpu/block_forward_cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <optional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"
#include "gpu/expert_stream.h"
#include "gpu/moe_kernels.h"

namespace ckpt::gpu {
namespace {

using forward::BlockConfig;
using forward::BlockResult;
using forward::BlockWeights;
using forward::DenseMatrix;
using forward::Fp4Matrix;

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

#define CKPT_CUDA_RETURN(expr)                                   \
  do {                                                           \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return CudaError(e_, #expr); \
  } while (0)

// Device allocations freed together when the run ends.
class DeviceArena {
 public:
  ~DeviceArena() {
    for (void* p : blocks_) cudaFree(p);
  }
  template <typename T>
  absl::StatusOr<T*> Alloc(size_t count) {
    void* p = nullptr;
    CKPT_CUDA_RETURN(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    blocks_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  absl::StatusOr<T*> Upload(const T* data, size_t count) {
    auto p = Alloc<T>(count);
    if (!p.ok()) return p.status();
    if (count > 0) CKPT_CUDA_RETURN(cudaMemcpy(*p, data, count * sizeof(T), cudaMemcpyHostToDevice));
    return *p;
  }
  template <typename T>
  absl::StatusOr<T*> Upload(const std::vector<T>& v) { return Upload(v.data(), v.size()); }

 private:
  std::vector<void*> blocks_;
};

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = quant::EncodeBF16(v[i]);
  return out;
}

bool Bf16Exact(const std::vector<float>& v) {
  for (float f : v) {
    if (quant::DecodeBF16(quant::EncodeBF16(f)) != f) return false;
  }
  return true;
}

// A dense weight on the device: BF16 when every value is a BF16 number (the checkpoint's
// BF16 tensors), F32 otherwise, so no value is ever rounded.
struct DeviceDense {
  const uint16_t* bf16 = nullptr;
  const float* f32 = nullptr;
  int rows = 0, cols = 0;
};

absl::StatusOr<DeviceDense> UploadDense(DeviceArena& arena, const DenseMatrix& m, bool force_f32) {
  DeviceDense d;
  d.rows = static_cast<int>(m.rows);
  d.cols = static_cast<int>(m.cols);
  if (!force_f32 && Bf16Exact(m.values)) {
    auto p = arena.Upload(ToBf16(m.values));
    if (!p.ok()) return p.status();
    d.bf16 = *p;
  } else {
    auto p = arena.Upload(m.values);
    if (!p.ok()) return p.status();
    d.f32 = *p;
  }
  return d;
}

void Linear(const DeviceDense& w, const uint16_t* x, int tokens, const float* bias, float* out,
            uint16_t* out_bf16) {
  if (w.bf16 != nullptr) {
    LaunchLinearBF16(x, tokens, w.bf16, bias, w.rows, w.cols, out, out_bf16, nullptr);
  } else {
    LaunchLinearF32(x, tokens, w.f32, bias, w.rows, w.cols, out, out_bf16, nullptr);
  }
}

GluParams GluOf(const BlockConfig& c) {
  GluParams p;
  p.beta = static_cast<float>(c.situ_beta);
  p.linear_beta = static_cast<float>(c.situ_linear_beta);
  p.limit = static_cast<float>(c.swiglu_limit);
  p.alpha = static_cast<float>(c.swiglu_alpha);
  switch (c.activation) {
    case forward::Activation::kSiTUGlu: p.kind = GluKind::kSiTU; break;
    case forward::Activation::kSiluGlu: p.kind = GluKind::kSilu; break;
    case forward::Activation::kClampedSwiGlu: p.kind = GluKind::kClampedSwiGlu; break;
  }
  return p;
}

template <typename T>
absl::StatusOr<std::vector<T>> Download(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CKPT_CUDA_RETURN(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

absl::Status DownloadDoubles(const float* p, size_t n, std::vector<double>* out) {
  auto v = Download(p, n);
  if (!v.ok()) return v.status();
  out->assign(v->begin(), v->end());
  return absl::OkStatus();
}

absl::Status DownloadBf16(const uint16_t* p, size_t n, std::vector<double>* out) {
  auto v = Download(p, n);
  if (!v.ok()) return v.status();
  out->resize(n);
  for (size_t i = 0; i < n; ++i) (*out)[i] = quant::DecodeBF16((*v)[i]);
  return absl::OkStatus();
}

absl::Status CheckShapes(const BlockConfig& c, const BlockWeights& w) {
  if (absl::Status s = forward::CheckBlockWeights(c, w); !s.ok()) return s;
  const int in = c.latent > 0 ? c.latent : c.hidden;
  for (int d : {c.hidden, in, c.expert_intermediate, c.shared_intermediate}) {
    if (d % 32 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA forward: block widths must be multiples of 32, got ", d));
    }
  }
  const forward::Fp4Scale kind = w.experts[0].gate.scale_kind;
  for (const forward::ExpertWeights& e : w.experts) {
    for (const Fp4Matrix* m : {&e.gate, &e.up, &e.down}) {
      if (m->scale_kind != kind) {
        return absl::InvalidArgumentError(
            absl::StrCat("CUDA forward: ", m->name, " mixes MXFP4 and NVFP4 in one block"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaAvailable() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (n == 0) return absl::FailedPreconditionError("no CUDA device present");
  return absl::OkStatus();
}

absl::StatusOr<BlockResult> RunBlockCuda(const BlockConfig& c, const BlockWeights& w,
                                         const forward::BlockInput& input,
                                         forward::Precision precision, CudaRunStats* stats) {
  if (precision != forward::Precision::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA forward computes W4A16 (precision bf16), not ", PrecisionName(precision)));
  }
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  if (absl::Status s = CheckShapes(c, w); !s.ok()) return s;
  const int T = static_cast<int>(input.tokens), H = c.hidden, E = c.experts, K = c.top_k;
  const int D = c.latent > 0 ? c.latent : H, I = c.expert_intermediate;
  if (T <= 0 || input.values.size() != static_cast<size_t>(T) * H) {
    return absl::InvalidArgumentError("CUDA forward: input is not [T, hidden]");
  }
  DeviceArena arena;
  BlockResult r;
  r.tokens = T;

  // Routing: router GEMV in FP32 (F32 weights), then top-k on the GPU.
  auto x = arena.Upload(ToBf16(input.values));
  auto router = UploadDense(arena, w.router, /*force_f32=*/true);
  auto logits = arena.Alloc<float>(static_cast<size_t>(T) * E);
  auto ids = arena.Alloc<int>(static_cast<size_t>(T) * K);
  auto weights = arena.Alloc<float>(static_cast<size_t>(T) * K);
  for (const absl::Status& s : {x.status(), router.status(), logits.status(), ids.status(),
                                weights.status()}) {
    if (!s.ok()) return s;
  }
  const float* router_bias = nullptr;
  if (!w.router_bias.empty()) {
    auto b = arena.Upload(w.router_bias);
    if (!b.ok()) return b.status();
    router_bias = *b;
  }
  Linear(*router, *x, T, router_bias, *logits, nullptr);
  TopKLaunch tk;
  tk.logits = *logits;
  tk.tokens = T;
  tk.experts = E;
  tk.top_k = K;
  tk.n_group = c.n_group;
  tk.topk_group = c.topk_group;
  tk.softmax = c.family == forward::BlockFamily::kGptOss;
  tk.norm_topk_prob = c.norm_topk_prob;
  tk.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  tk.ids = *ids;
  tk.weights = *weights;
  if (!tk.softmax) {
    auto cb = arena.Upload(w.correction_bias);
    if (!cb.ok()) return cb.status();
    tk.correction_bias = *cb;
  }
  LaunchTopK(tk, nullptr);
  CKPT_CUDA_RETURN(cudaGetLastError());

  // Expert input: the latent projection (BF16) or x itself.
  const uint16_t* z = *x;
  if (c.latent > 0) {
    auto down = UploadDense(arena, w.latent_down, false);
    auto zf = arena.Alloc<float>(static_cast<size_t>(T) * D);
    auto zb = arena.Alloc<uint16_t>(static_cast<size_t>(T) * D);
    for (const absl::Status& s : {down.status(), zf.status(), zb.status()}) if (!s.ok()) return s;
    Linear(*down, *x, T, nullptr, *zf, *zb);
    z = *zb;
  }

  // The selected experts: ids come back, then only those experts' bytes go up.
  auto host_ids = Download(*ids, static_cast<size_t>(T) * K);
  if (!host_ids.ok()) return host_ids.status();
  std::map<int, std::vector<int>> slots_of;  // expert -> slots, ascending
  for (int i = 0; i < T * K; ++i) {
    const int e = (*host_ids)[i];
    if (e < 0 || e >= E) return absl::InternalError(absl::StrCat("CUDA top-k gave expert ", e));
    slots_of[e].push_back(i);
  }
  // Only the selected experts' bytes go up, streamed chunk by chunk with the expert kernels of
  // each chunk starting as soon as its bytes have arrived (gpu/expert_stream.h).
  std::vector<HostExpert> selected;
  std::vector<int> offsets = {0}, pair_slots;
  for (const auto& [e, slots] : slots_of) {
    const forward::ExpertWeights& ex = w.experts[e];
    HostExpert h;
    HostFp4* hm[3] = {&h.gate, &h.up, &h.down};
    const Fp4Matrix* m[3] = {&ex.gate, &ex.up, &ex.down};
    for (int k = 0; k < 3; ++k) {
      *hm[k] = {m[k]->packed.data(), m[k]->packed.size(), m[k]->scales.data(),
                m[k]->scales.size(), m[k]->global_scale};
    }
    if (!ex.gate_bias.empty()) {
      auto gb = arena.Upload(ex.gate_bias);
      auto ub = arena.Upload(ex.up_bias);
      auto db = arena.Upload(ex.down_bias);
      for (const absl::Status& s : {gb.status(), ub.status(), db.status()}) if (!s.ok()) return s;
      h.gate_bias = *gb;
      h.up_bias = *ub;
      h.down_bias = *db;
    }
    selected.push_back(h);
    pair_slots.insert(pair_slots.end(), slots.begin(), slots.end());
    offsets.push_back(static_cast<int>(pair_slots.size()));
  }

  auto doffsets = arena.Upload(offsets);
  auto dslots = arena.Upload(pair_slots);
  auto a = arena.Alloc<uint16_t>(static_cast<size_t>(T) * K * I);
  auto h = arena.Alloc<float>(static_cast<size_t>(T) * K * D);
  auto y = arena.Alloc<float>(static_cast<size_t>(T) * D);
  auto yb = arena.Alloc<uint16_t>(static_cast<size_t>(T) * D);
  for (const absl::Status& s : {doffsets.status(), dslots.status(), a.status(), h.status(),
                                y.status(), yb.status()}) {
    if (!s.ok()) return s;
  }
  ExpertLaunch el;
  el.kind = w.experts[0].gate.scale_kind == forward::Fp4Scale::kE8M0Group32 ? Fp4Kind::kMxfp4
                                                                           : Fp4Kind::kNvfp4;
  el.glu = GluOf(c);
  el.in_dim = D;
  el.intermediate = I;
  el.top_k = K;
  el.num_experts = static_cast<int>(selected.size());
  el.pair_offsets = *doffsets;
  el.pair_slots = *dslots;
  el.z = z;
  el.a = *a;
  el.h = *h;
  ExpertStreamer streamer;
  if (absl::Status s = streamer.Run(selected, el, nullptr); !s.ok()) return s;
  if (stats != nullptr) {
    stats->experts_uploaded = static_cast<int>(selected.size());
    stats->expert_bytes_uploaded = streamer.bytes_copied();
  }

  const float* norm = nullptr;
  if (c.latent > 0 && c.latent_norm) {
    auto nw = arena.Upload(w.latent_norm);
    if (!nw.ok()) return nw.status();
    norm = *nw;
  }
  LaunchCombine(*h, *weights, T, K, D, norm, static_cast<float>(c.rms_eps), *y, *yb, nullptr);

  auto routed = arena.Alloc<float>(static_cast<size_t>(T) * H);
  auto shared = arena.Alloc<float>(static_cast<size_t>(T) * H);
  auto out = arena.Alloc<float>(static_cast<size_t>(T) * H);
  for (const absl::Status& s : {routed.status(), shared.status(), out.status()}) if (!s.ok()) return s;
  const float* routed_ptr = *y;  // without latent projections y is the routed output
  if (c.latent > 0) {
    auto up = UploadDense(arena, w.latent_up, false);
    if (!up.ok()) return up.status();
    Linear(*up, *yb, T, nullptr, *routed, nullptr);
    routed_ptr = *routed;
  }
  CKPT_CUDA_RETURN(cudaMemset(*shared, 0, sizeof(float) * T * H));
  if (c.shared_intermediate > 0) {
    const int S = c.shared_intermediate;
    auto sg = UploadDense(arena, w.shared_gate, false);
    auto su = UploadDense(arena, w.shared_up, false);
    auto sd = UploadDense(arena, w.shared_down, false);
    auto g = arena.Alloc<float>(static_cast<size_t>(T) * S);
    auto u = arena.Alloc<float>(static_cast<size_t>(T) * S);
    auto sa = arena.Alloc<uint16_t>(static_cast<size_t>(T) * S);
    for (const absl::Status& s : {sg.status(), su.status(), sd.status(), g.status(), u.status(),
                                  sa.status()}) {
      if (!s.ok()) return s;
    }
    Linear(*sg, *x, T, nullptr, *g, nullptr);
    Linear(*su, *x, T, nullptr, *u, nullptr);
    LaunchGlu(*g, *u, T * S, GluOf(c), *sa, nullptr);
    Linear(*sd, *sa, T, nullptr, *shared, nullptr);
  }
  LaunchAdd(routed_ptr, *shared, T * H, *out, nullptr);
  CKPT_CUDA_RETURN(cudaGetLastError());
  CKPT_CUDA_RETURN(cudaDeviceSynchronize());

  r.topk_ids = std::move(*host_ids);
  for (const absl::Status& s :
       {DownloadDoubles(*logits, static_cast<size_t>(T) * E, &r.router_logits),
        DownloadDoubles(*weights, static_cast<size_t>(T) * K, &r.topk_weights),
        DownloadDoubles(routed_ptr, static_cast<size_t>(T) * H, &r.routed_out),
        DownloadDoubles(*shared, static_cast<size_t>(T) * H, &r.shared_out),
        DownloadDoubles(*out, static_cast<size_t>(T) * H, &r.output)}) {
    if (!s.ok()) return s;
  }
  if (c.latent > 0) {
    if (absl::Status s = DownloadBf16(z, static_cast<size_t>(T) * D, &r.latent_in); !s.ok()) return s;
    if (absl::Status s = DownloadBf16(*yb, static_cast<size_t>(T) * D, &r.latent_out_normed); !s.ok())
      return s;
  }
  return r;
}

namespace {

std::string VersionString(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

// The kernel driver's version ("580.159.04") from /proc/driver/nvidia/version, whose first line
// reads "NVRM version: NVIDIA UNIX [Open ]Kernel Module [for ]<arch>  <version>  <date>": the
// first word after "Kernel Module" that starts with a digit; empty if there is none.
std::string KernelDriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return "";
  const size_t at = line.find("Kernel Module");
  if (at == std::string::npos) return "";
  std::istringstream words(line.substr(at + 13));
  for (std::string word; words >> word;) {
    if (word[0] >= '0' && word[0] <= '9' && word.size() <= 32 &&
        word.find_first_not_of("0123456789.") == std::string::npos) {
      return word;
    }
  }
  return "";
}

std::optional<forward::GpuProperties> Properties() {
  if (!CudaAvailable().ok()) return std::nullopt;
  cudaDeviceProp prop;
  int device = 0, driver = 0, runtime = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDriverGetVersion(&driver) != cudaSuccess ||
      cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    return std::nullopt;
  }
  forward::GpuProperties p;
  p.name = std::string(prop.name, strnlen(prop.name, sizeof(prop.name)));
  p.sm = absl::StrCat(prop.major, ".", prop.minor);
  // The kernel driver's own version where readable, and the CUDA version it supports.
  const std::string kernel = KernelDriverVersion();
  p.driver = kernel.empty() ? absl::StrCat("CUDA ", VersionString(driver))
                            : absl::StrCat(kernel, " (CUDA ", VersionString(driver), ")");
  p.cuda = VersionString(runtime);
  return p;
}

}  // namespace

forward::ForwardDevice CudaDevice() {
  return {"cuda", "CUDA W4A16 kernels (gpu/)",
          [](const BlockConfig& c, const BlockWeights& w, const forward::BlockInput& in,
             forward::Precision p) { return RunBlockCuda(c, w, in, p); },
          Properties()};
}

absl::StatusOr<forward::ForwardDevice> OpenCudaDevice() {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  forward::ForwardDevice d = CudaDevice();
  if (!d.gpu) return absl::FailedPreconditionError("CUDA device properties could not be read");
  return d;
}

}  // namespace ckpt::gpu
