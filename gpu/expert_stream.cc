#include "gpu/expert_stream.h"

#include "gpu/cuda_status.h"

namespace ckpt::gpu {
namespace {

constexpr size_t kAlign = 256;  // every matrix starts 16-byte aligned (the kernels' uint4 loads)

size_t Aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t ExpertBytes(const HostExpert& e) {
  size_t n = 0;
  for (const HostFp4* m : {&e.gate, &e.up, &e.down}) {
    n += Aligned(m->packed_bytes) + Aligned(m->scale_bytes);
  }
  return n;
}

}  // namespace

ExpertStreamer::~ExpertStreamer() {
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  cudaFree(buffer_);
  cudaFree(table_);
}

absl::Status ExpertStreamer::Reserve(size_t bytes, size_t experts) {
  if (copy_ == nullptr) CKPT_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  if (bytes > capacity_) {
    CKPT_CUDA_RETURN(cudaDeviceSynchronize());  // the old buffer may still be read
    cudaFree(buffer_);
    buffer_ = nullptr;
    capacity_ = 0;
    CKPT_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&buffer_), bytes));
    capacity_ = bytes;
  }
  if (experts > table_capacity_) {
    CKPT_CUDA_RETURN(cudaDeviceSynchronize());
    cudaFree(table_);
    table_ = nullptr;
    table_capacity_ = 0;
    CKPT_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&table_), experts * sizeof(DeviceExpert)));
    table_capacity_ = experts;
  }
  return absl::OkStatus();
}

absl::Status ExpertStreamer::Run(const std::vector<HostExpert>& experts, ExpertLaunch launch,
                                 cudaStream_t compute, size_t chunk_bytes) {
  bytes_copied_ = 0;
  chunks_ = 0;
  if (experts.empty()) return absl::OkStatus();
  size_t total = 0;
  for (const HostExpert& e : experts) total += ExpertBytes(e);
  if (absl::Status s = Reserve(total, experts.size()); !s.ok()) return s;

  // Where each matrix lands in the device buffer, in expert order.
  std::vector<DeviceExpert> table(experts.size());
  std::vector<size_t> expert_start(experts.size() + 1, 0);
  size_t at = 0;
  for (size_t i = 0; i < experts.size(); ++i) {
    expert_start[i] = at;
    const HostExpert& e = experts[i];
    DeviceFp4* d[3] = {&table[i].gate, &table[i].up, &table[i].down};
    const HostFp4* h[3] = {&e.gate, &e.up, &e.down};
    for (int k = 0; k < 3; ++k) {
      d[k]->packed = buffer_ + at;
      at += Aligned(h[k]->packed_bytes);
      d[k]->scales = buffer_ + at;
      at += Aligned(h[k]->scale_bytes);
      d[k]->global_scale = h[k]->global_scale;
      d[k]->global_multiplies = h[k]->global_multiplies;
    }
    table[i].gate_bias = e.gate_bias;
    table[i].up_bias = e.up_bias;
    table[i].down_bias = e.down_bias;
  }
  expert_start[experts.size()] = at;

  // The buffer may still be read by the previous run's kernels: copies wait for them.
  cudaEvent_t previous_done;
  CKPT_CUDA_RETURN(cudaEventCreateWithFlags(&previous_done, cudaEventDisableTiming));
  events_.push_back(previous_done);
  CKPT_CUDA_RETURN(cudaEventRecord(previous_done, compute));
  CKPT_CUDA_RETURN(cudaStreamWaitEvent(copy_, previous_done, 0));
  CKPT_CUDA_RETURN(cudaMemcpyAsync(table_, table.data(), table.size() * sizeof(DeviceExpert),
                                     cudaMemcpyHostToDevice, compute));

  size_t first = 0;
  while (first < experts.size()) {
    size_t last = first + 1;  // one chunk: experts [first, last)
    while (last < experts.size() && expert_start[last] - expert_start[first] < chunk_bytes) {
      ++last;
    }
    for (size_t i = first; i < last; ++i) {
      const HostExpert& e = experts[i];
      const DeviceFp4* d[3] = {&table[i].gate, &table[i].up, &table[i].down};
      const HostFp4* h[3] = {&e.gate, &e.up, &e.down};
      for (int k = 0; k < 3; ++k) {
        CKPT_CUDA_RETURN(cudaMemcpyAsync(const_cast<uint8_t*>(d[k]->packed), h[k]->packed,
                                           h[k]->packed_bytes, cudaMemcpyHostToDevice, copy_));
        CKPT_CUDA_RETURN(cudaMemcpyAsync(const_cast<uint8_t*>(d[k]->scales), h[k]->scales,
                                           h[k]->scale_bytes, cudaMemcpyHostToDevice, copy_));
        bytes_copied_ += h[k]->packed_bytes + h[k]->scale_bytes;
      }
    }
    cudaEvent_t arrived;
    CKPT_CUDA_RETURN(cudaEventCreateWithFlags(&arrived, cudaEventDisableTiming));
    events_.push_back(arrived);
    CKPT_CUDA_RETURN(cudaEventRecord(arrived, copy_));
    CKPT_CUDA_RETURN(cudaStreamWaitEvent(compute, arrived, 0));
    ExpertLaunch part = launch;
    part.experts = table_ + first;
    part.pair_offsets = launch.pair_offsets + first;
    part.num_experts = static_cast<int>(last - first);
    LaunchExperts(part, compute);
    CKPT_CUDA_RETURN(cudaGetLastError());
    ++chunks_;
    first = last;
  }
  // Events are released once the work that records them is done.
  CKPT_CUDA_RETURN(cudaStreamSynchronize(copy_));
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  return absl::OkStatus();
}

}  // namespace ckpt::gpu
