#include "services/daemon/audit_backend.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/fingerprint/fingerprint.h"
#include "core/text/json_dump.h"
#include "core/interop/publish.h"

namespace ckpt::daemon {
namespace {

constexpr char kVerifierId[] = "https://ckpt-audit.dev/ckpt-auditd";

// Reasons a stored record failed: each failing check with its first finding.
std::vector<std::string> FailureReasons(const std::string& payload) {
  std::vector<std::string> reasons;
  auto j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("predicate")) return reasons;
  for (const auto& c : j["predicate"].value("checks", nlohmann::json::array())) {
    if (c.value("verdict", "") != "fail") continue;
    std::string reason = absl::StrCat("check ", c.value("name", "?"), " failed");
    const auto& findings = c.value("findings", nlohmann::json::array());
    if (!findings.empty()) absl::StrAppend(&reason, ": ", DumpJson(findings[0]));
    reasons.push_back(std::move(reason));
  }
  return reasons;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AuditBackend>> AuditBackend::Create(
    const BackendOptions& options, evidence::SigningKey key, evidence::TrustStore trust) {
  BackendOptions resolved = options;
  resolved.allowed_roots.clear();
  for (const std::string& dir : options.allowed_roots) {
    auto real = RealPath(dir);
    if (!real.ok()) return real.status();
    resolved.allowed_roots.push_back(*real);
  }
  auto log = storage::EvidenceLog::Open(options.db_path, /*create=*/true);
  if (!log.ok()) return log.status();
  return std::unique_ptr<AuditBackend>(new AuditBackend(
      std::move(resolved), std::move(key), std::move(trust), *std::move(log)));
}

AuditBackend::AuditBackend(BackendOptions options, evidence::SigningKey key,
                           evidence::TrustStore trust, std::unique_ptr<storage::EvidenceLog> log)
    : options_(std::move(options)),
      key_(std::move(key)),
      trust_(std::move(trust)),
      log_(std::move(log)) {
  jobs_ = std::make_unique<JobManager>(
      [this](const JobSpec& spec, Progress& progress) {
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<JobOutcome> outcome = RunJob(spec, progress);
        if (options_.observer != nullptr) {
          options_.observer->AuditFinished(
              outcome.ok() ? std::string_view(outcome->verdict) : "error",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              outcome.ok() ? outcome->bytes_read : 0);
        }
        return outcome;
      },
      options_.workers, options_.max_queued);
}

AuditBackend::~AuditBackend() { jobs_.reset(); }  // join workers before the log goes

absl::StatusOr<std::string> AuditBackend::CheckAllowed(const std::string& root) const {
  auto real = RealPath(root);
  if (!real.ok()) return real.status();
  for (const std::string& dir : options_.allowed_roots) {
    if (*real == dir || absl::StartsWith(*real, dir + "/")) return *real;
  }
  return absl::PermissionDeniedError(
      absl::StrCat(root, " (", *real, ") is outside the daemon's allowed roots"));
}

absl::StatusOr<std::string> AuditBackend::StartAudit(JobSpec spec) {
  auto root = CheckAllowed(spec.root);
  if (!root.ok()) return root.status();
  spec.root = *root;
  if (!spec.source_root.empty()) {
    auto source = CheckAllowed(spec.source_root);
    if (!source.ok()) return source.status();
    spec.source_root = *source;
  }
  if (spec.policy.empty()) spec.policy = audit::kDefaultPolicy;
  if (auto p = audit::PolicyByName(spec.policy); !p.ok()) return p.status();
  return jobs_->Submit(std::move(spec));
}

absl::StatusOr<storage::AppendResult> AuditBackend::Append(const std::string& envelope) {
  std::lock_guard<std::mutex> lock(log_mu_);
  return log_->Append(envelope, key_);
}

absl::StatusOr<JobOutcome> AuditBackend::RunJob(const JobSpec& spec, Progress& progress) {
  audit::AuditOptions options;
  options.root = spec.root;
  options.source = spec.source_root;
  options.policy = spec.policy;
  options.threads = options_.threads_per_audit;
  options.invoker = spec.invoker;
  auto record = audit::RunAudit(options, progress);
  if (!record.ok()) return record.status();
  uint64_t bytes_read = 0;  // what the audit read from storage, both trees (docs/evidence.md)
  for (const evidence::CheckResult& c : record->checks) {
    if (c.name == "fingerprint" && c.counts.count("bytes_read")) {
      bytes_read = static_cast<uint64_t>(c.counts.at("bytes_read"));
    }
  }
  absl::StatusOr<interop::PublishedAudit> published;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    published = interop::PublishAudit(*record, key_, *log_);
  }
  if (!published.ok()) return published.status();
  return JobOutcome{evidence::VerdictName(record->OverallVerdict()),
                    static_cast<int64_t>(published->record_id), bytes_read};
}

absl::StatusOr<GateDecision> AuditBackend::Gate(const std::string& root,
                                                const std::string& policy_name,
                                                Progress& progress,
                                                const std::string& invoker) {
  auto real = CheckAllowed(root);
  if (!real.ok()) return real.status();
  const std::string policy = policy_name.empty() ? audit::kDefaultPolicy : policy_name;
  auto policy_config = audit::PolicyByName(policy);
  if (!policy_config.ok()) return policy_config.status();
  FingerprintOptions fo;
  fo.threads = options_.threads_per_audit;
  fo.tensor_digests = false;  // the manifest ROOT covers every file's bytes
  auto fp = FingerprintTree(*real, fo, progress);
  if (!fp.ok()) return fp.status();

  GateDecision d;
  d.manifest_root = fp->manifest.RootHex();
  std::optional<storage::LogEntry> audit_entry;
  storage::QueryFilter filter;
  filter.digest = d.manifest_root;
  filter.policy = policy;
  for (;;) {  // newest first; skip earlier gate decisions over the same subjects
    absl::StatusOr<storage::QueryPage> page;
    {
      std::lock_guard<std::mutex> lock(log_mu_);
      page = log_->Query(filter);
    }
    if (!page.ok()) return page.status();
    for (const auto& e : page->entries) {
      if (e.predicate_type == evidence::kEvidencePredicateType) {
        audit_entry = e;
        break;
      }
    }
    if (audit_entry || page->next_page_token.empty()) break;
    filter.page_token = page->next_page_token;
  }

  evidence::EvidenceRecord decision;
  decision.root = *real;
  decision.policy = audit::PolicyRefOf(*policy_config);
  decision.environment = evidence::CollectEnvironment();
  decision.started_at = decision.finished_at = evidence::Rfc3339Now();
  decision.subjects = audit::SubjectsOf(*fp);
  decision.invoker = invoker;
  evidence::CheckResult gate{.name = "gate"};
  std::string input_uri, input_sha256;
  if (!audit_entry) {
    gate.verdict = evidence::Verdict::kFail;
    d.reasons.push_back(absl::StrCat("no audit record under policy ", policy,
                                     " for this content (OMS manifest ROOT ", d.manifest_root,
                                     "); run an audit first"));
    input_uri = absl::StrCat(log_->origin(), "#none");
    input_sha256 = d.manifest_root;
  } else {
    d.record_id = static_cast<int64_t>(audit_entry->seq);
    input_uri = absl::StrCat(log_->origin(), "#", audit_entry->seq);
    input_sha256 = ToHex(Sha256Of(evidence::AsBytes(audit_entry->envelope)));
    auto envelope = evidence::ParseEnvelope(audit_entry->envelope);
    absl::StatusOr<std::string> signer =
        envelope.ok() ? evidence::VerifyEnvelope(*envelope, trust_) : envelope.status();
    if (!signer.ok()) {
      gate.verdict = evidence::Verdict::kFail;
      d.reasons.push_back(absl::StrCat("record ", audit_entry->seq,
                                       " does not verify: ", signer.status().message()));
    } else if (audit_entry->verdict != "pass") {
      gate.verdict = evidence::Verdict::kFail;
      d.reasons.push_back(absl::StrCat("record ", audit_entry->seq, " (", audit_entry->time,
                                       ") failed policy ", policy));
      for (auto& r : FailureReasons(envelope->payload)) d.reasons.push_back(std::move(r));
    } else {
      d.pass = true;
      d.reasons.push_back(absl::StrCat("record ", audit_entry->seq, " (", audit_entry->time,
                                       ", signed by ", *signer, ") passed policy ", policy,
                                       " for exactly this content"));
    }
  }
  decision.checks.push_back(std::move(gate));
  auto payload =
      evidence::VerificationSummaryPayload(decision, kVerifierId, input_uri, input_sha256);
  if (!payload.ok()) return payload.status();
  auto appended =
      Append(evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, key_));
  if (!appended.ok()) return appended.status();
  d.decision_id = static_cast<int64_t>(appended->seq);
  if (options_.observer != nullptr) options_.observer->GateDecided(d.pass);
  return d;
}

absl::StatusOr<storage::QueryPage> AuditBackend::Query(const storage::QueryFilter& filter) {
  std::lock_guard<std::mutex> lock(log_mu_);
  return log_->Query(filter);
}

absl::StatusOr<storage::LogEntry> AuditBackend::GetRecord(uint64_t id) {
  std::lock_guard<std::mutex> lock(log_mu_);
  return log_->Get(id);
}

absl::StatusOr<storage::LogVerification> AuditBackend::VerifyLog() {
  std::lock_guard<std::mutex> lock(log_mu_);
  return storage::VerifyLog(*log_, trust_);
}

absl::StatusOr<InclusionProofResult> AuditBackend::InclusionProof(uint64_t id) {
  std::lock_guard<std::mutex> lock(log_mu_);
  auto latest = log_->LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  InclusionProofResult r;
  r.leaf_index = id;
  r.tree_size = latest->first;
  r.checkpoint = latest->second;
  if (id >= r.tree_size) {
    return absl::NotFoundError(absl::StrCat("no record ", id, " in a log of ", r.tree_size));
  }
  auto hashes = log_->InclusionProof(id, r.tree_size);
  if (!hashes.ok()) return hashes.status();
  r.hashes = *std::move(hashes);
  auto root = log_->RootAt(r.tree_size);
  if (!root.ok()) return root.status();
  r.root = *root;
  return r;
}

}  // namespace ckpt::daemon
