#include "gpu/block_forward_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <map>
#include <optional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"
#include "gpu/cuda_status.h"
#include "gpu/expert_stream.h"
#include "gpu/moe_kernels.h"

namespace ckpt::gpu {
namespace {

using forward::BlockConfig;
using forward::BlockResult;
using forward::BlockWeights;
using forward::DenseMatrix;
using forward::Fp4Matrix;

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
  if (!force_f32 && m.dtype == DType::kBF16) {  // the stored bytes, copied as they are
    const size_t count = static_cast<size_t>(m.rows * m.cols);
    auto p = arena.Alloc<uint16_t>(count);
    if (!p.ok()) return p.status();
    if (count > 0) {
      CKPT_CUDA_RETURN(cudaMemcpy(*p, m.bytes.data(), count * 2, cudaMemcpyHostToDevice));
    }
    d.bf16 = *p;
    return d;
  }
  const std::vector<float> values = m.Floats();
  if (!force_f32 && Bf16Exact(values)) {
    auto p = arena.Upload(ToBf16(values));
    if (!p.ok()) return p.status();
    d.bf16 = *p;
  } else {
    auto p = arena.Upload(values);
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

// What every stage needs: the W4A16 precision, a device, kernel widths, a [T, hidden] input.
absl::Status CheckStage(const BlockConfig& c, forward::Precision precision, int64_t tokens,
                        size_t input_values) {
  if (precision != forward::Precision::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA forward computes W4A16 (precision bf16), not ", PrecisionName(precision)));
  }
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  const int in = c.latent > 0 ? c.latent : c.hidden;
  for (int d : {c.hidden, in, c.expert_intermediate, c.shared_intermediate}) {
    if (d % 32 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA forward: block widths must be multiples of 32, got ", d));
    }
  }
  if (tokens <= 0 || input_values != static_cast<size_t>(tokens) * c.hidden) {
    return absl::InvalidArgumentError("CUDA forward: input is not [T, hidden]");
  }
  return absl::OkStatus();
}

std::vector<float> Floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// The routed state of a route stage for this block and input.
absl::Status CheckRouted(const BlockConfig& c, const BlockResult& r, int64_t tokens) {
  const size_t slots = static_cast<size_t>(tokens) * c.top_k;
  if (r.tokens != tokens || r.topk_ids.size() != slots || r.topk_weights.size() != slots ||
      (c.latent > 0 && r.latent_in.size() != static_cast<size_t>(tokens) * c.latent)) {
    return absl::InvalidArgumentError("CUDA forward: the routed state does not fit the block");
  }
  return absl::OkStatus();
}

// Router GEMV in FP32 (F32 weights), top-k on the GPU, then the expert input: the latent
// projection (BF16) or x itself.
absl::Status RouteCuda(const BlockConfig& c, const BlockWeights& w,
                       const forward::BlockInput& input, forward::Precision precision,
                       BlockResult* r) {
  if (absl::Status s = CheckStage(c, precision, input.tokens, input.values.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = forward::CheckRoutingWeights(c, w); !s.ok()) return s;
  const int T = static_cast<int>(input.tokens), E = c.experts, K = c.top_k;
  const int D = c.latent > 0 ? c.latent : c.hidden;
  DeviceArena arena;
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
  const uint16_t* z = nullptr;
  if (c.latent > 0) {
    auto down = UploadDense(arena, w.latent_down, false);
    auto zf = arena.Alloc<float>(static_cast<size_t>(T) * D);
    auto zb = arena.Alloc<uint16_t>(static_cast<size_t>(T) * D);
    for (const absl::Status& s : {down.status(), zf.status(), zb.status()}) if (!s.ok()) return s;
    Linear(*down, *x, T, nullptr, *zf, *zb);
    z = *zb;
  }
  CKPT_CUDA_RETURN(cudaGetLastError());
  CKPT_CUDA_RETURN(cudaDeviceSynchronize());
  auto host_ids = Download(*ids, static_cast<size_t>(T) * K);
  if (!host_ids.ok()) return host_ids.status();
  for (int e : *host_ids) {
    if (e < 0 || e >= E) return absl::InternalError(absl::StrCat("CUDA top-k gave expert ", e));
  }
  r->tokens = T;
  r->topk_ids = std::move(*host_ids);
  for (const absl::Status& s :
       {DownloadDoubles(*logits, static_cast<size_t>(T) * E, &r->router_logits),
        DownloadDoubles(*weights, static_cast<size_t>(T) * K, &r->topk_weights)}) {
    if (!s.ok()) return s;
  }
  r->latent_in.clear();
  if (z != nullptr) return DownloadBf16(z, static_cast<size_t>(T) * D, &r->latent_in);
  return absl::OkStatus();
}

// The listed experts on the slots that chose them: only their packed bytes and scales are
// copied to the GPU, streamed chunk by chunk with the expert kernels of each chunk starting as
// soon as its bytes have arrived (gpu/expert_stream.h).
absl::Status ExpertsCuda(const BlockConfig& c, const forward::ExpertSet& experts,
                         const forward::BlockInput& input, const BlockResult& routed,
                         forward::Precision precision, std::vector<double>* h_out,
                         CudaRunStats* stats) {
  if (absl::Status s = CheckStage(c, precision, input.tokens, input.values.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRouted(c, routed, input.tokens); !s.ok()) return s;
  const int T = static_cast<int>(input.tokens), K = c.top_k;
  const int D = c.latent > 0 ? c.latent : c.hidden, I = c.expert_intermediate;
  if (h_out->size() != static_cast<size_t>(T) * K * D) {
    return absl::InvalidArgumentError("CUDA forward: expert rows do not fit the block");
  }
  DeviceArena arena;
  std::vector<HostExpert> selected;
  std::vector<int> offsets = {0}, pair_slots;
  std::optional<forward::Fp4Scale> kind;
  for (const auto& [id, ex] : experts) {
    if (absl::Status s = forward::CheckExpertWeights(c, *ex); !s.ok()) return s;
    std::vector<int> slots;
    for (int i = 0; i < T * K; ++i) {
      if (routed.topk_ids[i] == id) slots.push_back(i);
    }
    if (slots.empty()) continue;
    const Fp4Matrix* m[3] = {&ex->gate, &ex->up, &ex->down};
    for (const Fp4Matrix* mk : m) {
      if (kind && *kind != mk->scale_kind) {
        return absl::InvalidArgumentError(
            absl::StrCat("CUDA forward: ", mk->name, " mixes MXFP4 and NVFP4 in one block"));
      }
      kind = mk->scale_kind;
    }
    HostExpert he;
    HostFp4* hm[3] = {&he.gate, &he.up, &he.down};
    for (int k = 0; k < 3; ++k) {
      *hm[k] = {m[k]->packed.data(), m[k]->packed.size(), m[k]->scales.data(),
                m[k]->scales.size(), m[k]->global.value,
                m[k]->global.role == quant::GlobalRole::kMultiplier ? 1 : 0};
    }
    if (!ex->gate_bias.empty()) {
      auto gb = arena.Upload(ex->gate_bias);
      auto ub = arena.Upload(ex->up_bias);
      auto db = arena.Upload(ex->down_bias);
      for (const absl::Status& s : {gb.status(), ub.status(), db.status()}) if (!s.ok()) return s;
      he.gate_bias = *gb;
      he.up_bias = *ub;
      he.down_bias = *db;
    }
    selected.push_back(he);
    pair_slots.insert(pair_slots.end(), slots.begin(), slots.end());
    offsets.push_back(static_cast<int>(pair_slots.size()));
  }
  if (stats != nullptr) stats->experts_uploaded += static_cast<int>(selected.size());
  if (selected.empty()) return absl::OkStatus();

  auto z = arena.Upload(ToBf16(c.latent > 0 ? Floats(routed.latent_in) : input.values));
  auto doffsets = arena.Upload(offsets);
  auto dslots = arena.Upload(pair_slots);
  auto a = arena.Alloc<uint16_t>(static_cast<size_t>(T) * K * I);
  auto h = arena.Alloc<float>(static_cast<size_t>(T) * K * D);
  for (const absl::Status& s : {z.status(), doffsets.status(), dslots.status(), a.status(),
                                h.status()}) {
    if (!s.ok()) return s;
  }
  ExpertLaunch el;
  el.kind = *kind == forward::Fp4Scale::kE8M0Group32 ? Fp4Kind::kMxfp4 : Fp4Kind::kNvfp4;
  el.glu = GluOf(c);
  el.in_dim = D;
  el.intermediate = I;
  el.top_k = K;
  el.num_experts = static_cast<int>(selected.size());
  el.pair_offsets = *doffsets;
  el.pair_slots = *dslots;
  el.z = *z;
  el.a = *a;
  el.h = *h;
  ExpertStreamer streamer;
  if (absl::Status s = streamer.Run(selected, el, nullptr); !s.ok()) return s;
  if (stats != nullptr) stats->expert_bytes_uploaded += streamer.bytes_copied();
  CKPT_CUDA_RETURN(cudaGetLastError());
  CKPT_CUDA_RETURN(cudaDeviceSynchronize());
  auto rows = Download(*h, static_cast<size_t>(T) * K * D);
  if (!rows.ok()) return rows.status();
  for (int slot : pair_slots) {
    std::copy_n(rows->begin() + static_cast<size_t>(slot) * D, D,
                h_out->begin() + static_cast<size_t>(slot) * D);
  }
  return absl::OkStatus();
}

// shared = GLU(x Wg^T, x Wu^T) Wd^T, zero without a shared expert.
absl::Status SharedCuda(const BlockConfig& c, const BlockWeights& w,
                        const forward::BlockInput& input, forward::Precision precision,
                        BlockResult* r) {
  if (absl::Status s = CheckStage(c, precision, input.tokens, input.values.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = forward::CheckSharedWeights(c, w); !s.ok()) return s;
  const int T = static_cast<int>(input.tokens), H = c.hidden;
  if (c.shared_intermediate <= 0) {
    r->shared_out.assign(static_cast<size_t>(T) * H, 0.0);
    return absl::OkStatus();
  }
  const int S = c.shared_intermediate;
  DeviceArena arena;
  auto x = arena.Upload(ToBf16(input.values));
  auto sg = UploadDense(arena, w.shared_gate, false);
  auto su = UploadDense(arena, w.shared_up, false);
  auto sd = UploadDense(arena, w.shared_down, false);
  auto g = arena.Alloc<float>(static_cast<size_t>(T) * S);
  auto u = arena.Alloc<float>(static_cast<size_t>(T) * S);
  auto sa = arena.Alloc<uint16_t>(static_cast<size_t>(T) * S);
  auto shared = arena.Alloc<float>(static_cast<size_t>(T) * H);
  for (const absl::Status& s : {x.status(), sg.status(), su.status(), sd.status(), g.status(),
                                u.status(), sa.status(), shared.status()}) {
    if (!s.ok()) return s;
  }
  Linear(*sg, *x, T, nullptr, *g, nullptr);
  Linear(*su, *x, T, nullptr, *u, nullptr);
  LaunchGlu(*g, *u, T * S, GluOf(c), *sa, nullptr);
  Linear(*sd, *sa, T, nullptr, *shared, nullptr);
  CKPT_CUDA_RETURN(cudaGetLastError());
  CKPT_CUDA_RETURN(cudaDeviceSynchronize());
  return DownloadDoubles(*shared, static_cast<size_t>(T) * H, &r->shared_out);
}

// Combine + RMSNorm (top-k terms added in ascending slot order), up-projection, routed + shared.
absl::Status FinishCuda(const BlockConfig& c, const BlockWeights& w,
                        const std::vector<double>& h_in, forward::Precision precision,
                        BlockResult* r) {
  const int T = static_cast<int>(r->tokens), H = c.hidden, K = c.top_k;
  const int D = c.latent > 0 ? c.latent : H;
  if (absl::Status s = CheckStage(c, precision, T, static_cast<size_t>(T) * H); !s.ok()) return s;
  if (absl::Status s = CheckRouted(c, *r, T); !s.ok()) return s;
  if (absl::Status s = forward::CheckLatentOutWeights(c, w); !s.ok()) return s;
  if (h_in.size() != static_cast<size_t>(T) * K * D ||
      r->shared_out.size() != static_cast<size_t>(T) * H) {
    return absl::InvalidArgumentError("CUDA forward: expert rows or shared output missing");
  }
  DeviceArena arena;
  auto h = arena.Upload(Floats(h_in));
  auto weights = arena.Upload(Floats(r->topk_weights));
  auto shared = arena.Upload(Floats(r->shared_out));
  auto y = arena.Alloc<float>(static_cast<size_t>(T) * D);
  auto yb = arena.Alloc<uint16_t>(static_cast<size_t>(T) * D);
  auto routed = arena.Alloc<float>(static_cast<size_t>(T) * H);
  auto out = arena.Alloc<float>(static_cast<size_t>(T) * H);
  for (const absl::Status& s : {h.status(), weights.status(), shared.status(), y.status(),
                                yb.status(), routed.status(), out.status()}) {
    if (!s.ok()) return s;
  }
  const float* norm = nullptr;
  if (c.latent > 0 && c.latent_norm) {
    auto nw = arena.Upload(w.latent_norm);
    if (!nw.ok()) return nw.status();
    norm = *nw;
  }
  LaunchCombine(*h, *weights, T, K, D, norm, static_cast<float>(c.rms_eps), *y, *yb, nullptr);
  const float* routed_ptr = *y;  // without latent projections y is the routed output
  if (c.latent > 0) {
    auto up = UploadDense(arena, w.latent_up, false);
    if (!up.ok()) return up.status();
    Linear(*up, *yb, T, nullptr, *routed, nullptr);
    routed_ptr = *routed;
  }
  LaunchAdd(routed_ptr, *shared, T * H, *out, nullptr);
  CKPT_CUDA_RETURN(cudaGetLastError());
  CKPT_CUDA_RETURN(cudaDeviceSynchronize());
  for (const absl::Status& s :
       {DownloadDoubles(routed_ptr, static_cast<size_t>(T) * H, &r->routed_out),
        DownloadDoubles(*out, static_cast<size_t>(T) * H, &r->output)}) {
    if (!s.ok()) return s;
  }
  r->latent_out_normed.clear();
  if (c.latent > 0) return DownloadBf16(*yb, static_cast<size_t>(T) * D, &r->latent_out_normed);
  return absl::OkStatus();
}

forward::BlockStages CudaStages(CudaRunStats* stats) {
  return {RouteCuda,
          [stats](const BlockConfig& c, const forward::ExpertSet& experts,
                  const forward::BlockInput& input, const BlockResult& routed,
                  forward::Precision p, std::vector<double>* h) {
            return ExpertsCuda(c, experts, input, routed, p, h, stats);
          },
          SharedCuda, FinishCuda};
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
  if (absl::Status s = CheckStage(c, precision, input.tokens, input.values.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = forward::CheckBlockWeights(c, w); !s.ok()) return s;
  if (stats != nullptr) *stats = CudaRunStats();
  return forward::RunStages(CudaStages(stats), c, w, input, precision);
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
  return {"cuda", "CUDA W4A16 kernels (gpu/)", CudaStages(nullptr), Properties()};
}

absl::StatusOr<forward::ForwardDevice> OpenCudaDevice() {
  if (absl::Status s = CudaAvailable(); !s.ok()) return s;
  forward::ForwardDevice d = CudaDevice();
  if (!d.gpu) return absl::FailedPreconditionError("CUDA device properties could not be read");
  return d;
}

}  // namespace ckpt::gpu
