// A gRPC server interceptor that sees every call's method, caller, status and latency, and
// writes one structured log line (json_log.h) and the per-method metrics (metrics.h) for it.
// It observes, and changes one status only: gRPC's UNIMPLEMENTED for a known method's request
// that does not parse becomes INVALID_ARGUMENT. Authorization happens in the handlers
// (grpc_service.h).
#ifndef CKPT_SERVICES_DAEMON_RPC_OBSERVER_H_
#define CKPT_SERVICES_DAEMON_RPC_OBSERVER_H_

#include <atomic>
#include <cstdint>

#include "grpcpp/support/server_interceptor.h"
#include "services/daemon/auth.h"
#include "services/daemon/metrics.h"

namespace ckpt::daemon {

class RpcObserverFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // `metrics` may be null (no --metrics-listen). Both must outlive the server.
  RpcObserverFactory(const Authenticator& auth, DaemonMetrics* metrics)
      : auth_(auth), metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
  // Calls seen so far: how the daemon tells that it has gone idle (serving.h ReleaseIdleMemory).
  uint64_t calls_started() const { return calls_started_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> calls_started_{0};
  const Authenticator& auth_;
  DaemonMetrics* metrics_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_RPC_OBSERVER_H_
