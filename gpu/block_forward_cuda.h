// The MoE block forward on a CUDA GPU: same weights (forward::BlockWeights) and input as the
// CPU reference, same outputs (forward::BlockResult), computed by the W4A16 kernels of
// moe_kernels.h in the arithmetic of Precision::kBF16 (BF16 activations where the CPU's bf16
// mode rounds, FP32 accumulation, FP4 experts dequantized inside the GEMVs).
//
// Only the selected experts' packed bytes and scales are copied to the GPU: routing runs on
// the GPU first, its expert ids come back, and then exactly those experts are uploaded.
#ifndef CKPT_GPU_BLOCK_FORWARD_CUDA_H_
#define CKPT_GPU_BLOCK_FORWARD_CUDA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/forward/block_forward.h"
#include "core/forward/forward_audit.h"

namespace ckpt::gpu {

// OK when a CUDA device can be used; otherwise FAILED_PRECONDITION saying why (no driver,
// no device), for tests to skip with.
absl::Status CudaAvailable();

struct CudaRunStats {
  int experts_uploaded = 0;         // distinct selected experts
  uint64_t expert_bytes_uploaded = 0;  // their packed bytes + scales
};

// INVALID_ARGUMENT for a precision other than kBF16, or dimensions the kernels cannot take
// (widths not multiples of 32); INTERNAL for a CUDA error (named).
absl::StatusOr<forward::BlockResult> RunBlockCuda(const forward::BlockConfig& config,
                                                  const forward::BlockWeights& weights,
                                                  const forward::BlockInput& input,
                                                  forward::Precision precision,
                                                  CudaRunStats* stats = nullptr);

// RunBlockCuda as a forward-audit device named "cuda", with the properties of device 0 (name,
// SM, driver and runtime versions) when one is present.
forward::ForwardDevice CudaDevice();

// CudaDevice() after CudaAvailable(): FAILED_PRECONDITION (saying why) without a usable GPU,
// so that a GPU request never silently runs on the CPU.
absl::StatusOr<forward::ForwardDevice> OpenCudaDevice();

}  // namespace ckpt::gpu

#endif  // CKPT_GPU_BLOCK_FORWARD_CUDA_H_
