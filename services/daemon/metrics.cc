#include "services/daemon/metrics.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ckpt::daemon {
namespace {

namespace prom = prometheus;

// The job queue, read when Prometheus scrapes rather than pushed on every change.
class JobGauges final : public prom::Collectable {
 public:
  explicit JobGauges(std::function<JobCounts()> counts) : counts_(std::move(counts)) {}
  std::vector<prom::MetricFamily> Collect() const override {
    JobCounts c = counts_();
    return {Gauge("ckpt_auditd_jobs_queued", "audit jobs waiting for a worker", c.queued),
            Gauge("ckpt_auditd_jobs_running", "audit jobs running now", c.running)};
  }

 private:
  static prom::MetricFamily Gauge(std::string name, std::string help, size_t value) {
    prom::ClientMetric m;
    m.gauge.value = static_cast<double>(value);
    return prom::MetricFamily{std::move(name), std::move(help), prom::MetricType::Gauge, {m}};
  }
  std::function<JobCounts()> counts_;
};

const prom::Histogram::BucketBoundaries kRpcBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
const prom::Histogram::BucketBoundaries kAuditBuckets = {
    0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400};

}  // namespace

struct DaemonMetrics::State {
  std::shared_ptr<prom::Registry> registry = std::make_shared<prom::Registry>();
  prom::Family<prom::Counter>& rpcs =
      prom::BuildCounter()
          .Name("ckpt_auditd_rpcs_handled_total")
          .Help("RPCs completed, by full method name and gRPC status code")
          .Register(*registry);
  prom::Family<prom::Histogram>& rpc_seconds =
      prom::BuildHistogram()
          .Name("ckpt_auditd_rpc_duration_seconds")
          .Help("RPC latency from the call's start to its status (whole stream for WatchJob)")
          .Register(*registry);
  prom::Family<prom::Counter>& audits =
      prom::BuildCounter()
          .Name("ckpt_auditd_audits_total")
          .Help("audit jobs finished, by verdict (pass, fail; error when the audit could not run)")
          .Register(*registry);
  prom::Histogram& audit_seconds =
      prom::BuildHistogram()
          .Name("ckpt_auditd_audit_duration_seconds")
          .Help("audit job run time on a worker")
          .Register(*registry)
          .Add({}, kAuditBuckets);
  prom::Counter& bytes_read = prom::BuildCounter()
                                  .Name("ckpt_auditd_audit_bytes_read_total")
                                  .Help("bytes read from storage by finished audits (both "
                                        "trees of a pair audit)")
                                  .Register(*registry)
                                  .Add({});
  prom::Family<prom::Counter>& gates = prom::BuildCounter()
                                           .Name("ckpt_auditd_gate_decisions_total")
                                           .Help("gate decisions recorded, by result")
                                           .Register(*registry);
  prom::Family<prom::Counter>& attaches =
      prom::BuildCounter()
          .Name("ckpt_auditd_attaches_total")
          .Help("--attach: audit records pushed as OCI referrers, by result (ok, error)")
          .Register(*registry);
  std::shared_ptr<JobGauges> job_gauges;
  std::unique_ptr<prom::Exposer> exposer;
};

DaemonMetrics::DaemonMetrics() : state_(std::make_unique<State>()) {}
DaemonMetrics::~DaemonMetrics() = default;

absl::StatusOr<int> DaemonMetrics::Serve(const std::string& address,
                                         std::function<JobCounts()> job_counts) {
  state_->job_gauges = std::make_shared<JobGauges>(std::move(job_counts));
  try {
    // A connection holds one of the threads until its request is answered or 2 s pass
    // without progress: one peer that sends half a request and stops must not hold up the
    // scrapes (docs/daemon.md, "Limits").
    state_->exposer = std::make_unique<prom::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "4", "request_timeout_ms", "2000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  state_->exposer->RegisterCollectable(state_->registry);
  state_->exposer->RegisterCollectable(state_->job_gauges);
  std::vector<int> ports = state_->exposer->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("metrics listener bound no port");
  return ports.front();
}

void DaemonMetrics::RpcHandled(std::string_view method, std::string_view code, double seconds) {
  state_->rpcs.Add({{"method", std::string(method)}, {"code", std::string(code)}}).Increment();
  state_->rpc_seconds.Add({{"method", std::string(method)}}, kRpcBuckets).Observe(seconds);
}

void DaemonMetrics::AuditFinished(std::string_view verdict, double seconds, uint64_t bytes_read) {
  state_->audits.Add({{"verdict", std::string(verdict)}}).Increment();
  state_->audit_seconds.Observe(seconds);
  state_->bytes_read.Increment(static_cast<double>(bytes_read));
}

void DaemonMetrics::GateDecided(bool pass) {
  state_->gates.Add({{"result", pass ? "pass" : "fail"}}).Increment();
}

void DaemonMetrics::Attached(std::string_view, std::string_view, const absl::Status& result) {
  state_->attaches.Add({{"result", result.ok() ? "ok" : "error"}}).Increment();
}

}  // namespace ckpt::daemon
