#include "services/daemon/rpc_observer.h"

#include <chrono>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "services/daemon/grpc_service.h"
#include "services/daemon/json_log.h"

namespace ckpt::daemon {
namespace {

namespace gx = grpc::experimental;

class RpcObserver final : public gx::Interceptor {
 public:
  RpcObserver(gx::ServerRpcInfo* info, const Authenticator& auth, DaemonMetrics* metrics)
      : info_(info), auth_(auth), metrics_(metrics), start_(std::chrono::steady_clock::now()) {}

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      // gRPC's callback API answers a request message that does not parse with UNIMPLEMENTED
      // and no message. No handler of a known method answers UNIMPLEMENTED, so there it is such
      // a request: the caller's error, said as one.
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty() && IsKnownMethod(info_->method())) {
        status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the request message does not parse");
        methods->ModifySendStatus(status);
      }
      Finish(status);
    }
    methods->Proceed();
  }

 private:
  void Finish(const grpc::Status& status) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    // The method name comes from the client: only known names become metric labels.
    const std::string method = IsKnownMethod(info_->method()) ? info_->method() : "other";
    const std::string code =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
    if (metrics_ != nullptr) metrics_->RpcHandled(method, code, seconds);
    auto caller = AuthenticateCall(auth_, *info_->server_context());
    const char* level = "info";
    switch (status.error_code()) {
      case grpc::StatusCode::OK: break;
      case grpc::StatusCode::INTERNAL:
      case grpc::StatusCode::DATA_LOSS:
      case grpc::StatusCode::UNKNOWN: level = "error"; break;
      default: level = "warn";
    }
    nlohmann::ordered_json line = {
        {"method", method},
        {"code", code},
        {"invoker", caller.ok() ? caller->Invoker() : ""},
        {"peer", info_->server_context()->peer()},
        {"latency_ms", std::round(seconds * 1e6) / 1e3},
    };
    if (!status.ok()) line["error"] = status.error_message();
    LogJson(level, line);
  }

  gx::ServerRpcInfo* info_;
  const Authenticator& auth_;
  DaemonMetrics* metrics_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace

gx::Interceptor* RpcObserverFactory::CreateServerInterceptor(gx::ServerRpcInfo* info) {
  calls_started_.fetch_add(1, std::memory_order_relaxed);
  return new RpcObserver(info, auth_, metrics_);
}

}  // namespace ckpt::daemon
