// Prometheus metrics of ckpt-auditd on their own HTTP listener (`--metrics-listen`, GET
// /metrics; docs/daemon.md, "Metrics"): RPCs handled by method and gRPC code with latency
// histograms, audits by verdict with durations and bytes read, gate decisions, attaches by
// result, and the job queue read at scrape time. The only file that knows prometheus-cpp.
#ifndef CKPT_SERVICES_DAEMON_METRICS_H_
#define CKPT_SERVICES_DAEMON_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/daemon/audit_observer.h"
#include "services/daemon/job_manager.h"

namespace ckpt::daemon {

class DaemonMetrics final : public AuditObserver {
 public:
  DaemonMetrics();
  ~DaemonMetrics() override;

  // Starts the HTTP listener on `address` ("127.0.0.1:9464", "[::1]:0", ...) and returns the
  // bound port. `job_counts` is called on every scrape.
  absl::StatusOr<int> Serve(const std::string& address, std::function<JobCounts()> job_counts);

  // `method` must come from a fixed set (the rpc observer maps unknown names to "other") so
  // that a client cannot grow the label space.
  void RpcHandled(std::string_view method, std::string_view code, double seconds);
  void AuditFinished(std::string_view verdict, double seconds, uint64_t bytes_read) override;
  void GateDecided(bool pass) override;
  void Attached(std::string_view job, std::string_view subject,
                const absl::Status& result) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_METRICS_H_
