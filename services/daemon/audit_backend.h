// What ckpt-auditd does, without gRPC: audits as durable jobs, gate decisions, evidence queries,
// proofs and log verification over one evidence log. The gRPC AuditService (grpc_service.h)
// validates and translates messages.
//
// Roots must resolve (realpath) inside one of the allow-listed directories: the daemon reads
// whatever path a client names, so an empty allow-list denies everything. Likewise an audit's
// oci:// root or source must name a registry on the registry allow-list, checked before any
// request goes to it (docs/daemon.md, "OCI subjects"). The daemon is the
// log's only writer (storage/evidence_log.h); appends go through one writer connection, reads
// through a pool of read-only connections, and each VerifyLog opens its own, so none of them
// waits for another (WAL). Gates read only verified entries (verified_index.h). Error messages
// name the log "evidence log", never its path. Thread-safe.
#ifndef CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_
#define CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"
#include "core/oci/reference.h"
#include "services/daemon/audit_observer.h"
#include "services/daemon/content_fingerprint.h"
#include "services/daemon/gate_policy.h"
#include "services/daemon/job_manager.h"
#include "services/daemon/slurm_executor.h"
#include "services/daemon/verified_index.h"
#include "storage/evidence_log.h"
#include "storage/job_table.h"
#include "storage/log_verifier.h"

namespace ckpt::daemon {

struct BackendOptions {
  std::string db_path;
  std::string head_path;  // where the writer keeps the newest signed checkpoint (none if empty)
  std::vector<std::string> allowed_roots;  // directories; realpath'ed at startup
  // Registries (host[:port]) whose oci:// roots and sources may be audited; normalised at
  // startup as core/oci/reference.h parses a reference's. Empty: none.
  std::vector<std::string> allowed_registries;
  // After an audit of an oci:// root is published, push its record as referrers of the manifest
  // (core/oci/attach_record.h).
  bool attach = false;
  unsigned workers = 1;                    // audits at once
  size_t max_queued = 64;
  unsigned threads_per_audit = 0;          // 0: all cores
  // How long an identical gate decision is returned again before a fresh one is signed: clients
  // refuse old decisions (docs/daemon.md "Gate clients").
  absl::Duration decision_reuse = absl::Minutes(1);
  AuditObserver* observer = nullptr;  // not owned; outlives the backend
  // --executor slurm: audits run as Slurm arrays of parts (slurm_executor.h); null: here.
  std::shared_ptr<const SlurmExecutor> slurm;
};

struct GateRequest {
  std::string root;
  std::string policy;                // scale-window policy name; empty = default
  std::string source_manifest_root;  // pinned source OMS ROOT (lower-case hex) or empty
  std::vector<quant::RootMapping> root_map;
  std::string invoker;  // auth.h Caller::Invoker(), recorded in a new decision
};

struct InclusionProofResult {
  uint64_t leaf_index = 0;
  uint64_t tree_size = 0;
  std::vector<storage::Hash> hashes;
  storage::Hash root{};
  std::string checkpoint;
};

struct GateDecision {
  bool pass = false;
  std::vector<std::string> reasons;
  int64_t record_id = -1;    // the audit record the decision rests on
  int64_t decision_id = -1;  // the signed verification summary stating the decision
  bool reused = false;       // decision_id was appended by an earlier, identical gate
  std::string manifest_root;
  std::string policy_uri;
  // The source OMS ROOT a pass rests on, as the signed decision names it (pinned or not);
  // empty when it rests on no source (gate_policy.h).
  std::string source_manifest_root;
  std::string envelope;        // the decision's exact DSSE bytes
  InclusionProofResult proof;  // of decision_id, against a signed checkpoint
  uint64_t hashed_bytes = 0;   // file bytes read by this gate (every file, every time)
};

class AuditBackend {
 public:
  // Opens (creating) the log as its writer and starts verifying it for gates in the background.
  // `trust` must include `key` for the daemon's own records to verify.
  static absl::StatusOr<std::unique_ptr<AuditBackend>> Create(const BackendOptions& options,
                                                              evidence::SigningKey key,
                                                              evidence::TrustStore trust);
  ~AuditBackend();

  absl::StatusOr<std::string> StartAudit(JobSpec spec);
  JobManager& jobs() { return *jobs_; }

  // Runs on the caller's thread and stops when `progress.Cancelled()` (the client left or its
  // deadline passed).
  absl::StatusOr<GateDecision> Gate(const GateRequest& request, Progress& progress);
  absl::StatusOr<storage::QueryPage> Query(const storage::QueryFilter& filter);
  absl::StatusOr<storage::LogEntry> GetRecord(uint64_t id);
  // `incremental`: from the last clean verification of this process (full when none).
  absl::StatusOr<storage::LogVerification> VerifyLog(bool incremental);
  absl::StatusOr<InclusionProofResult> InclusionProof(uint64_t id);
  // Facts of the verified audit record at `id` (a finished job's record_id): layouts and refs
  // for GetJob. nullopt when the log holds no verified audit record there.
  std::optional<AuditFacts> RecordFacts(int64_t id) const;

  // The oci:// reference `text` (request field `field`), parsed, if its registry is on the
  // allow-list: INVALID_ARGUMENT for one that does not parse, PERMISSION_DENIED naming the
  // registry otherwise. No network access.
  absl::StatusOr<oci::Reference> CheckRegistry(absl::string_view field,
                                               const std::string& text) const;
  // realpath(root) if it lies inside an allowed directory; PERMISSION_DENIED otherwise.
  absl::StatusOr<std::string> CheckAllowed(const std::string& root) const;
  // Opens `root` and checks where the opened directory really is against the allow-list;
  // work then goes through the descriptor, never the path again. PERMISSION_DENIED outside.
  absl::StatusOr<std::shared_ptr<const io::Directory>> OpenAllowed(const std::string& root) const;

  // For a graceful stop (SIGTERM): see JobManager::Drain.
  bool Drain(absl::Time deadline) { return jobs_->Drain(deadline); }
  // Closes the read connections no call is using, with their SQLite page caches; a later read
  // opens a new one. The daemon calls it when a burst of calls is over (IdleMemoryReleaser).
  void CloseIdleReaders();
  // OK when audits and new gate decisions can be appended; otherwise why not (a read-only or
  // damaged database, or a log that does not match its signed checkpoint).
  absl::Status append_status() const;

 private:
  class ReaderPool;
  AuditBackend(BackendOptions options, evidence::SigningKey key, evidence::TrustStore trust,
               std::unique_ptr<storage::EvidenceLog> writer);
  absl::StatusOr<JobOutcome> RunJob(const JobSpec& spec, JobRun& run);
  absl::Status CheckRootMap(const std::vector<quant::RootMapping>& map) const;
  absl::StatusOr<storage::AppendResult> Append(const std::string& envelope);
  // Signs nothing once `run` is cancelled: JobRun::Commit under the write lock.
  absl::StatusOr<JobOutcome> Publish(const evidence::EvidenceRecord& record, JobRun& run);
  // --attach: pushes record `record_id` as referrers of the manifest `reference` names by
  // digest, noting the step for the job's watchers and the observer; the referrers pushed.
  absl::StatusOr<std::vector<JobReferrer>> Attach(const std::string& reference,
                                                  int64_t record_id, JobRun& run);
  // Adds entries [from, log size) to the gate index; requires write_mu_.
  absl::Status IndexAppendedLocked(uint64_t from);
  // The format of the checkpoint under `root`, whose files must be those of `content`.
  absl::StatusOr<GatePolicy> PolicyFor(std::shared_ptr<const io::Directory> root,
                                       const Content& content, const GateRequest& request,
                                       const std::string& scale_policy, Progress& progress);
  // Entry `seq`'s exact bytes, equal to the verified entry (VerifiedLogIndex::CheckEntry), from
  // the envelope cache or read back from the log.
  absl::StatusOr<std::string> ReadVerifiedEntry(uint64_t seq);

  const BackendOptions options_;
  const evidence::SigningKey key_;
  const evidence::TrustStore trust_;
  std::mutex write_mu_;
  std::unique_ptr<storage::EvidenceLog> writer_;  // guarded by write_mu_
  std::unique_ptr<storage::JobTable> job_table_;
  std::unique_ptr<storage::JobTable> job_lookup_;  // read-only: the job manager's Get
  std::unique_ptr<ReaderPool> readers_;
  VerifiedLogIndex index_;
  std::thread index_loader_;
  ContentFingerprinter fingerprinter_;
  std::mutex decision_mu_;  // one gate at a time between "is there such a decision" and append
  // Envelopes read back and found equal to their verified entries, by log index: a reused
  // decision (and a failing record's reasons) cost no database read. Sound because the index's
  // leaf hash of an entry never changes and the cached bytes hashed to it; a row rewritten in
  // the database later cannot reach a gate through the cache, and without it would fail
  // CheckEntry (docs/daemon.md "Gate cost and change detection"). At most
  // kMaxCachedEnvelopeBytes; the cache starts over beyond that.
  std::mutex envelope_mu_;
  std::unordered_map<uint64_t, std::string> envelopes_;  // guarded by envelope_mu_
  size_t envelope_bytes_ = 0;                             // guarded by envelope_mu_
  std::mutex format_mu_;
  std::map<std::string, std::pair<quant::QuantFormat, uint64_t>> formats_;  // guarded
  std::mutex verify_mu_;       // one incremental VerifyLog at a time
  std::mutex verify_state_mu_;
  storage::VerifiedLogState verified_;  // guarded by verify_state_mu_
  std::unique_ptr<JobManager> jobs_;    // last: its workers use everything above
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_AUDIT_BACKEND_H_
