// The gRPC AuditService (proto/ckpt_audit/v1/audit.proto): a thin adapter that validates every
// request field (request_checks.h), translates messages to and from AuditBackend calls and
// absl::Status to grpc::Status, and cancels a gate whose caller left. Every handler starts by
// authorizing its caller (auth.h) for its method; nothing runs before that.
#ifndef CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_
#define CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_

#include <atomic>
#include <functional>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "services/daemon/audit_backend.h"
#include "services/daemon/auth.h"
#include "services/daemon/call_pool.h"
#include "services/daemon/caller_lanes.h"

namespace ckpt::daemon {

// The caller of a call: its `authorization` metadata checked against `auth`, and the subject
// of the client certificate the TLS layer verified (mutual TLS), if any.
absl::StatusOr<Caller> AuthenticateCall(const Authenticator& auth,
                                        const grpc::ServerContextBase& ctx);

namespace internal {
using Svc = ckpt_audit::v1::AuditService;
// Every method on gRPC's callback API, so that none takes a thread of the synchronous ones,
// which only reflection uses (docs/daemon.md, "Limits").
using AuditServiceBase = Svc::WithCallbackMethod_StartAudit<Svc::WithCallbackMethod_GetJob<
    Svc::WithCallbackMethod_Gate<Svc::WithCallbackMethod_QueryAudits<
        Svc::WithCallbackMethod_GetRecord<Svc::WithCallbackMethod_VerifyLog<
            Svc::WithCallbackMethod_GetInclusionProof<Svc::WithCallbackMethod_CancelJob<
                Svc::WithCallbackMethod_WatchJob<Svc::Service>>>>>>>>>;
}  // namespace internal

// The quick reads (GetJob, QueryAudits, GetRecord, GetInclusionProof) run on gRPC's callback
// threads as they arrive; Gate, StartAudit, CancelJob and VerifyLog, which may hash, wait for the
// writer or read the whole log, run on `work_threads` threads of their own, in arrival order;
// each WatchJob stream, a long wait, on a watcher thread of its own (docs/daemon.md, "Threads
// and memory"). No anonymous call can take any of these threads.
class GrpcAuditService final : public internal::AuditServiceBase {
 public:
  static constexpr int kDefaultWorkThreads = 4;
  // WatchJob streams open at once (each holds a watcher thread while it waits); more are
  // answered RESOURCE_EXHAUSTED.
  static constexpr int kMaxWatchers = 256;
  // Gates of one caller (auth.h Caller::Invoker) in the work pool at once, and waiting behind
  // them; one more is answered RESOURCE_EXHAUSTED (docs/daemon.md "Limits").
  static constexpr size_t kGatesRunningPerCaller = 2;
  static constexpr size_t kGatesWaitingPerCaller = 16;
  // Both must outlive the service.
  GrpcAuditService(AuditBackend& backend, const Authenticator& auth,
                   int work_threads = kDefaultWorkThreads);

  grpc::ServerUnaryReactor* StartAudit(grpc::CallbackServerContext*,
                                       const ckpt_audit::v1::StartAuditRequest*,
                                       ckpt_audit::v1::Job*) override;
  grpc::ServerWriteReactor<ckpt_audit::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext*, const ckpt_audit::v1::WatchJobRequest*) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext*,
                                   const ckpt_audit::v1::GetJobRequest*,
                                   ckpt_audit::v1::Job*) override;
  grpc::ServerUnaryReactor* Gate(grpc::CallbackServerContext*, const ckpt_audit::v1::GateRequest*,
                                 ckpt_audit::v1::GateResponse*) override;
  grpc::ServerUnaryReactor* QueryAudits(grpc::CallbackServerContext*,
                                        const ckpt_audit::v1::QueryAuditsRequest*,
                                        ckpt_audit::v1::QueryAuditsResponse*) override;
  grpc::ServerUnaryReactor* GetRecord(grpc::CallbackServerContext*,
                                      const ckpt_audit::v1::GetRecordRequest*,
                                      ckpt_audit::v1::Record*) override;
  grpc::ServerUnaryReactor* VerifyLog(grpc::CallbackServerContext*,
                                      const ckpt_audit::v1::VerifyLogRequest*,
                                      ckpt_audit::v1::VerifyLogResponse*) override;
  grpc::ServerUnaryReactor* GetInclusionProof(grpc::CallbackServerContext*,
                                              const ckpt_audit::v1::GetInclusionProofRequest*,
                                              ckpt_audit::v1::InclusionProof*) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext*,
                                      const ckpt_audit::v1::CancelJobRequest*,
                                      ckpt_audit::v1::Job*) override;

  // The work calls running on the work threads, waiting for one, and waiting in the callers'
  // gate lanes behind those, at this moment: what a test waits for before it asserts on a busy
  // daemon.
  struct WorkLoad {
    size_t running = 0;
    size_t waiting = 0;
    size_t in_lanes = 0;
  };
  WorkLoad work_load() const;

 private:
  // The call answered with `status` now, on the calling thread.
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, grpc::Status status);
  // The call answered with what `work` returns for the caller, run on the work threads once
  // the caller is authorized for `method` (through the caller's gate lane when `gate`); the
  // refusal now if not, or RESOURCE_EXHAUSTED now when too many such calls already wait.
  grpc::ServerUnaryReactor* Queue(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  std::function<grpc::Status(const Caller&)> work,
                                  bool gate = false);

  class JobWatch;
  // The events of the job, written to `watch` until it ends or the caller leaves; on a watcher
  // thread.
  grpc::Status DoWatchJob(grpc::CallbackServerContext* ctx,
                          const ckpt_audit::v1::WatchJobRequest* req, JobWatch& watch);

  // The work methods, for the caller Queue authorized.
  grpc::Status DoStartAudit(const Caller&, const ckpt_audit::v1::StartAuditRequest*,
                            ckpt_audit::v1::Job*);
  grpc::Status DoGate(const Caller&, grpc::ServerContextBase*, const ckpt_audit::v1::GateRequest*,
                      ckpt_audit::v1::GateResponse*);
  grpc::Status DoCancelJob(const ckpt_audit::v1::CancelJobRequest*, ckpt_audit::v1::Job*);
  grpc::Status DoVerifyLog(const ckpt_audit::v1::VerifyLogRequest*,
                           ckpt_audit::v1::VerifyLogResponse*);
  // The reads, which authorize their caller.
  grpc::Status DoGetJob(grpc::ServerContextBase*, const ckpt_audit::v1::GetJobRequest*,
                        ckpt_audit::v1::Job*);
  grpc::Status DoQueryAudits(grpc::ServerContextBase*, const ckpt_audit::v1::QueryAuditsRequest*,
                             ckpt_audit::v1::QueryAuditsResponse*);
  grpc::Status DoGetRecord(grpc::ServerContextBase*, const ckpt_audit::v1::GetRecordRequest*,
                           ckpt_audit::v1::Record*);
  grpc::Status DoGetInclusionProof(grpc::ServerContextBase*,
                                   const ckpt_audit::v1::GetInclusionProofRequest*,
                                   ckpt_audit::v1::InclusionProof*);
  // OK when the caller may call `method` (the name after the service); fills `caller` if given.
  grpc::Status Authorize(grpc::ServerContextBase* ctx, absl::string_view method,
                         Caller* caller = nullptr) const;

  AuditBackend& backend_;
  const Authenticator& auth_;
  std::atomic<int> watchers_{0};  // WatchJob streams open
  CallPool watch_threads_;
  CallerLanes gate_lanes_;  // before work_: its threads finish the lanes' calls
  CallPool work_;  // last: joined first, while the rest is still there
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_
