// CUDA runtime errors as absl::Status, for the host code in gpu/.
#ifndef CKPT_GPU_CUDA_STATUS_H_
#define CKPT_GPU_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt::gpu {

inline absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace ckpt::gpu

// Returns the CUDA error of `expr` as a Status from the enclosing function.
#define CKPT_CUDA_RETURN(expr)                                                                 \
  do {                                                                                         \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return ::ckpt::gpu::CudaError(e_, #expr); \
  } while (0)

#endif  // CKPT_GPU_CUDA_STATUS_H_
