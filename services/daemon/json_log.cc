#include "services/daemon/json_log.h"

#include <cstdio>
#include <mutex>
#include <string>

#include "core/evidence/environment.h"
#include "core/text/json_dump.h"
#include "grpc/support/log.h"

namespace ckpt::daemon {
namespace {

void LogGrpcMessage(gpr_log_func_args* args) {
  const char* level = args->severity == GPR_LOG_SEVERITY_ERROR  ? "error"
                      : args->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                                : "debug";
  LogJson(level, {{"msg", args->message},
                  {"source", std::string(args->file) + ":" + std::to_string(args->line)}});
}

}  // namespace

void LogJson(std::string_view level, const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json line = {{"time", evidence::Rfc3339Now()}, {"level", level}};
  for (const auto& [k, v] : fields.items()) line[k] = v;
  std::string text = DumpJson(line);
  text += '\n';
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

void RouteGrpcLogsToJson() { gpr_set_log_function(LogGrpcMessage); }

}  // namespace ckpt::daemon
