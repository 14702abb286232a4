// The forward device a CLI flag names (`--device cpu|cuda`), shared by `forward` and `audit`.
#ifndef CKPT_SERVICES_CLI_FORWARD_DEVICE_H_
#define CKPT_SERVICES_CLI_FORWARD_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/forward/forward_audit.h"

namespace ckpt::cli {

// "cpu": the CPU reference. "cuda": the CUDA kernels, FAILED_PRECONDITION without a usable GPU
// or in a build without CUDA (never a silent CPU run). INVALID_ARGUMENT for other names.
absl::StatusOr<forward::ForwardDevice> ForwardDeviceByName(const std::string& name);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_FORWARD_DEVICE_H_
