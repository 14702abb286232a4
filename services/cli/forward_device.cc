#include "services/cli/forward_device.h"

#include "absl/strings/str_cat.h"
#ifdef CKPT_HAVE_CUDA
#include "gpu/block_forward_cuda.h"
#endif

namespace ckpt::cli {

absl::StatusOr<forward::ForwardDevice> ForwardDeviceByName(const std::string& name) {
  if (name == "cpu") return forward::CpuDevice();
  if (name == "cuda") {
#ifdef CKPT_HAVE_CUDA
    return gpu::OpenCudaDevice();
#else
    return absl::FailedPreconditionError("this ckpt-audit was built without CUDA (no nvcc)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --device '", name, "' (cpu|cuda)"));
}

}  // namespace ckpt::cli
