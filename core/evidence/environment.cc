#include "core/evidence/environment.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace ckpt::evidence {
namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "unknown";
}

}  // namespace

nlohmann::ordered_json Environment::ToJson() const {
  nlohmann::ordered_json j = {{"tool", tool},           {"tool_version", tool_version},
                              {"git_commit", git_commit}, {"host", host},
                              {"os", os},               {"cpu_model", cpu_model},
                              {"cpu_threads", cpu_threads}};
  if (gpu) {
    j["gpu"] = {{"name", gpu->name}, {"sm", gpu->sm}, {"driver", gpu->driver},
                {"cuda", gpu->cuda}};
  }
  return j;
}

Environment CollectEnvironment() {
  Environment env;
  env.tool_version = CKPT_VERSION;
  env.git_commit = CKPT_GIT_COMMIT;
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) env.host = host;
  struct utsname u;
  if (::uname(&u) == 0) env.os = absl::StrFormat("%s %s %s", u.sysname, u.release, u.machine);
  env.cpu_model = CpuModel();
  env.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  return env;
}

std::string VersionText(const std::string& tool) {
  const std::string archs = CKPT_CUDA_ARCHS;
  std::string cuda = "none (built without CUDA)";
  if (!archs.empty()) {
    cuda.clear();
    for (absl::string_view a : absl::StrSplit(archs, ' ', absl::SkipEmpty())) {
      absl::StrAppend(&cuda, cuda.empty() ? "" : " ", "sm_", a);
    }
  }
  return absl::StrCat(tool, " ", CKPT_VERSION, "\ncommit ", CKPT_GIT_COMMIT, "\nbuild type ",
                      std::string(CKPT_BUILD_TYPE).empty() ? "(none)" : CKPT_BUILD_TYPE,
                      "\nCUDA architectures ", cuda);
}

std::string Rfc3339Now() {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm;
  ::gmtime_r(&secs, &tm);
  return absl::StrFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
}

}  // namespace ckpt::evidence
