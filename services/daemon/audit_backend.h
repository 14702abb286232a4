// What ckpt-auditd does, without gRPC: audits as jobs, gate decisions, evidence queries and
// proofs over one evidence log. The gRPC AuditService (grpc_service.h) only translates messages.
//
// Roots must resolve (realpath) inside one of the allow-listed directories: the daemon reads
// whatever path a client names, so an empty allow-list denies everything. Thread-safe: the log is
// used under log_mu_; audits run on the JobManager's workers.
#ifndef CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_
#define CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"
#include "services/daemon/audit_observer.h"
#include "services/daemon/job_manager.h"
#include "storage/evidence_log.h"
#include "storage/log_verifier.h"

namespace ckpt::daemon {

struct BackendOptions {
  std::string db_path;
  std::vector<std::string> allowed_roots;  // directories; realpath'ed at startup
  unsigned workers = 1;                    // audits at once
  size_t max_queued = 64;
  unsigned threads_per_audit = 0;          // 0: all cores
  AuditObserver* observer = nullptr;       // not owned; outlives the backend
};

struct GateDecision {
  bool pass = false;
  std::vector<std::string> reasons;
  int64_t record_id = -1;    // the audit record the decision rests on
  int64_t decision_id = -1;  // the signed verification summary appended for this call
  std::string manifest_root;
};

struct InclusionProofResult {
  uint64_t leaf_index = 0;
  uint64_t tree_size = 0;
  std::vector<storage::Hash> hashes;
  storage::Hash root{};
  std::string checkpoint;
};

class AuditBackend {
 public:
  // Opens (creating) the log. `trust` must include `key` for the daemon's own records to verify.
  static absl::StatusOr<std::unique_ptr<AuditBackend>> Create(const BackendOptions& options,
                                                              evidence::SigningKey key,
                                                              evidence::TrustStore trust);
  ~AuditBackend();

  absl::StatusOr<std::string> StartAudit(JobSpec spec);
  JobManager& jobs() { return *jobs_; }

  // `invoker` (auth.h Caller::Invoker()) is recorded in the decision.
  absl::StatusOr<GateDecision> Gate(const std::string& root, const std::string& policy,
                                    Progress& progress, const std::string& invoker);
  absl::StatusOr<storage::QueryPage> Query(const storage::QueryFilter& filter);
  absl::StatusOr<storage::LogEntry> GetRecord(uint64_t id);
  absl::StatusOr<storage::LogVerification> VerifyLog();
  absl::StatusOr<InclusionProofResult> InclusionProof(uint64_t id);

  // realpath(root) if it lies inside an allowed directory; PERMISSION_DENIED otherwise.
  absl::StatusOr<std::string> CheckAllowed(const std::string& root) const;

 private:
  AuditBackend(BackendOptions options, evidence::SigningKey key, evidence::TrustStore trust,
               std::unique_ptr<storage::EvidenceLog> log);
  absl::StatusOr<JobOutcome> RunJob(const JobSpec& spec, Progress& progress);
  absl::StatusOr<storage::AppendResult> Append(const std::string& envelope);

  const BackendOptions options_;
  const evidence::SigningKey key_;
  const evidence::TrustStore trust_;
  std::mutex log_mu_;
  std::unique_ptr<storage::EvidenceLog> log_;  // guarded by log_mu_
  std::unique_ptr<JobManager> jobs_;           // last: its workers use everything above
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_
