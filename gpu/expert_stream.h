// Streams the selected experts' FP4 bytes from host memory to the GPU and runs the routed-expert
// stage (moe_kernels.h LaunchExperts) chunk by chunk as soon as each chunk's bytes have arrived,
// so that copies overlap with the expert kernels (docs/forward.md "CUDA kernels").
//
// Copies run on a stream of their own (cudaMemcpyAsync; from pinned host memory they are pure
// DMA, from pageable memory the driver stages them), one event per chunk; the kernels of chunk k
// wait only for chunk k's event. The device buffer is kept and grown across calls.
#ifndef CKPT_GPU_EXPERT_STREAM_H_
#define CKPT_GPU_EXPERT_STREAM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gpu/moe_kernels.h"

namespace ckpt::gpu {

// One FP4 matrix's bytes in host memory.
struct HostFp4 {
  const uint8_t* packed = nullptr;
  size_t packed_bytes = 0;
  const uint8_t* scales = nullptr;
  size_t scale_bytes = 0;
  float global_scale = 1.0f;
  int global_multiplies = 0;  // as DeviceFp4
};

// One selected expert: its three matrices, and (gpt-oss) biases already on the device.
struct HostExpert {
  HostFp4 gate, up, down;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

class ExpertStreamer {
 public:
  ExpertStreamer() = default;
  ~ExpertStreamer();
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;

  // Copies `experts` (in the order of `launch`'s pair offsets) and launches the expert stage of
  // each chunk of about `chunk_bytes` on `compute`. `launch.experts` is filled in here;
  // `launch.pair_offsets` must point to num_experts + 1 device ints. Returns when everything is
  // enqueued; synchronize `compute` before reading `launch.h`. INTERNAL for a CUDA error.
  absl::Status Run(const std::vector<HostExpert>& experts, ExpertLaunch launch,
                   cudaStream_t compute, size_t chunk_bytes = size_t{64} << 20);

  uint64_t bytes_copied() const { return bytes_copied_; }  // by the last Run
  int chunks() const { return chunks_; }

 private:
  absl::Status Reserve(size_t bytes, size_t experts);
  uint8_t* buffer_ = nullptr;
  size_t capacity_ = 0;
  DeviceExpert* table_ = nullptr;
  size_t table_capacity_ = 0;
  cudaStream_t copy_ = nullptr;
  std::vector<cudaEvent_t> events_;
  uint64_t bytes_copied_ = 0;
  int chunks_ = 0;
};

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_EXPERT_STREAM_H_
