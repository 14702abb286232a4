// Where and with what an audit ran: tool version and git commit, host, CPU, optional GPU, and
// RFC 3339 UTC timestamps. Goes into every evidence record so a result can be reproduced.
#ifndef CKPT_CORE_EVIDENCE_ENVIRONMENT_H_
#define CKPT_CORE_EVIDENCE_ENVIRONMENT_H_

#include <optional>
#include <string>

#include "nlohmann/json.hpp"

namespace ckpt::evidence {

struct GpuInfo {
  std::string name;
  std::string sm;      // compute capability, e.g. "9.0"
  std::string driver;  // driver version string
  std::string cuda;    // CUDA runtime version string
};

struct Environment {
  std::string tool = "ckpt-audit";
  std::string tool_version;
  std::string git_commit;
  std::string host;
  std::string os;         // uname sysname + release
  std::string cpu_model;  // /proc/cpuinfo "model name"
  int cpu_threads = 0;
  std::optional<GpuInfo> gpu;  // set by the caller when a GPU check ran

  nlohmann::ordered_json ToJson() const;
};

// Fills everything but `gpu` from the build and the running machine.
Environment CollectEnvironment();

// What `--version` prints for `tool`: its version, the git commit it was built from, the build
// type and the CUDA architectures its kernels were built for ("none" without CUDA).
std::string VersionText(const std::string& tool);

// Now as "YYYY-MM-DDTHH:MM:SS.mmmZ".
std::string Rfc3339Now();

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_ENVIRONMENT_H_
