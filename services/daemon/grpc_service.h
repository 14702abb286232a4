// The gRPC AuditService (proto/ckpt_audit/v1/audit.proto): a thin adapter that validates every
// request field (request_checks.h), translates messages to and from AuditBackend calls and
// absl::Status to grpc::Status, and cancels a gate whose caller left. Every handler starts by
// authorizing its caller (auth.h) for its method; nothing runs before that.
#ifndef CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_
#define CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "services/daemon/audit_backend.h"
#include "services/daemon/auth.h"

namespace ckpt::daemon {

// The caller of a call: its `authorization` metadata checked against `auth`, and the subject
// of the client certificate the TLS layer verified (mutual TLS), if any.
absl::StatusOr<Caller> AuthenticateCall(const Authenticator& auth,
                                        const grpc::ServerContextBase& ctx);

class GrpcAuditService final : public ckpt_audit::v1::AuditService::Service {
 public:
  // Both must outlive the service.
  GrpcAuditService(AuditBackend& backend, const Authenticator& auth)
      : backend_(backend), auth_(auth) {}

  grpc::Status StartAudit(grpc::ServerContext*, const ckpt_audit::v1::StartAuditRequest*,
                          ckpt_audit::v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const ckpt_audit::v1::WatchJobRequest*,
                        grpc::ServerWriter<ckpt_audit::v1::JobEvent>*) override;
  grpc::Status GetJob(grpc::ServerContext*, const ckpt_audit::v1::GetJobRequest*,
                      ckpt_audit::v1::Job*) override;
  grpc::Status Gate(grpc::ServerContext*, const ckpt_audit::v1::GateRequest*,
                    ckpt_audit::v1::GateResponse*) override;
  grpc::Status QueryAudits(grpc::ServerContext*, const ckpt_audit::v1::QueryAuditsRequest*,
                           ckpt_audit::v1::QueryAuditsResponse*) override;
  grpc::Status GetRecord(grpc::ServerContext*, const ckpt_audit::v1::GetRecordRequest*,
                         ckpt_audit::v1::Record*) override;
  grpc::Status VerifyLog(grpc::ServerContext*, const ckpt_audit::v1::VerifyLogRequest*,
                         ckpt_audit::v1::VerifyLogResponse*) override;
  grpc::Status GetInclusionProof(grpc::ServerContext*,
                                 const ckpt_audit::v1::GetInclusionProofRequest*,
                                 ckpt_audit::v1::InclusionProof*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const ckpt_audit::v1::CancelJobRequest*,
                         ckpt_audit::v1::Job*) override;

 private:
  // OK when the caller may call `method` (the name after the service); fills `caller` if given.
  grpc::Status Authorize(grpc::ServerContext* ctx, absl::string_view method,
                         Caller* caller = nullptr) const;

  AuditBackend& backend_;
  const Authenticator& auth_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_GRPC_SERVICE_H_
