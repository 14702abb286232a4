#include "services/daemon/audit_backend.h"

#include <chrono>
#include <condition_variable>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/interop/publish.h"
#include "core/oci/attach_record.h"
#include "core/oci/audit_trees.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#ifdef CKPT_HAVE_CUDA
#include "gpu/block_forward_cuda.h"
#endif

namespace ckpt::daemon {
namespace {

constexpr char kVerifierId[] = "https://ckpt-audit.dev/ckpt-auditd";
constexpr char kLogLabel[] = "evidence log";  // error messages never show the database path
constexpr size_t kMaxReaders = 8;
constexpr size_t kMaxCachedFormats = 4096;
constexpr size_t kMaxCachedEnvelopeBytes = 16 << 20;

// Whether an RFC 3339 time lies less than `age` ago.
bool Within(const std::string& rfc3339, absl::Duration age) {
  absl::Time t;
  std::string err;
  return absl::ParseTime(absl::RFC3339_full, rfc3339, &t, &err) && absl::Now() - t < age;
}

// Reasons a stored record failed: each failing check with its first finding.
std::vector<std::string> FailureReasons(const std::string& payload) {
  std::vector<std::string> reasons;
  absl::StatusOr<nlohmann::json> parsed = evidence::ParseStrictJson(payload, "statement");
  if (!parsed.ok()) return reasons;
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("predicate") || !j["predicate"].is_object()) return reasons;
  const auto& checks = j["predicate"].value("checks", nlohmann::json::array());
  if (!checks.is_array()) return reasons;
  for (const auto& c : checks) {
    if (!c.is_object() || c.value("verdict", "") != "fail") continue;
    std::string reason = absl::StrCat("check ", c.value("name", "?"), " failed");
    const auto& findings = c.value("findings", nlohmann::json::array());
    if (findings.is_array() && !findings.empty()) {
      absl::StrAppend(&reason, ": ", DumpJson(findings[0]));
    }
    reasons.push_back(std::move(reason));
  }
  return reasons;
}

std::string MapKey(const std::vector<quant::RootMapping>& map) {
  std::string key;
  for (const auto& m : map) absl::StrAppend(&key, m.declared, "=", m.actual, "\n");
  return key;
}

}  // namespace

// Read-only connections, opened on demand (at most kMaxReaders) and reused.
class AuditBackend::ReaderPool {
 public:
  explicit ReaderPool(std::string path) : path_(std::move(path)) {}

  // Runs `fn` with a reader connection of its own.
  template <typename T>
  absl::StatusOr<T> With(const std::function<absl::StatusOr<T>(storage::EvidenceLog&)>& fn) {
    auto reader = Take();
    if (!reader.ok()) return reader.status();
    absl::StatusOr<T> result = fn(**reader);
    Give(*std::move(reader));
    return result;
  }

  absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> Open() const {
    return storage::EvidenceLog::OpenReadOnly(path_, kLogLabel);
  }

  // Closes the connections no call holds (their page caches and statements go with them).
  void CloseIdle() {
    std::vector<std::unique_ptr<storage::EvidenceLog>> closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing.swap(idle_);
      open_ -= closing.size();
      cv_.notify_all();
    }
  }

 private:
  absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> Take() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < kMaxReaders; });
    if (!idle_.empty()) {
      auto r = std::move(idle_.back());
      idle_.pop_back();
      return r;
    }
    ++open_;
    lock.unlock();
    auto r = Open();
    if (!r.ok()) {
      std::lock_guard<std::mutex> relock(mu_);
      --open_;
      cv_.notify_one();
    }
    return r;
  }
  void Give(std::unique_ptr<storage::EvidenceLog> r) {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(r));
    cv_.notify_one();
  }

  const std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<storage::EvidenceLog>> idle_;  // guarded by mu_
  size_t open_ = 0;                                         // guarded by mu_
};

absl::StatusOr<std::unique_ptr<AuditBackend>> AuditBackend::Create(
    const BackendOptions& options, evidence::SigningKey key, evidence::TrustStore trust) {
  BackendOptions resolved = options;
  resolved.allowed_roots.clear();
  for (const std::string& dir : options.allowed_roots) {
    auto real = RealPath(dir);
    if (!real.ok()) return real.status();
    resolved.allowed_roots.push_back(*real);
  }
  resolved.allowed_registries.clear();
  for (const std::string& registry : options.allowed_registries) {
    auto parsed = oci::ParseRegistry(registry);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--allow-registry: ",
                                                     parsed.status().message()));
    }
    resolved.allowed_registries.push_back(*std::move(parsed));
  }
  storage::LogOpenOptions open;
  open.create = true;
  open.label = kLogLabel;
  auto writer = storage::EvidenceLog::Open(options.db_path, open);
  if (!writer.ok()) return writer.status();
  if (!options.head_path.empty()) {
    if (auto s = (*writer)->KeepHeadIn(options.head_path); !s.ok()) return s;
  }
  std::unique_ptr<AuditBackend> backend(new AuditBackend(
      std::move(resolved), std::move(key), std::move(trust), *std::move(writer)));

  absl::Status accepting = backend->writer_->append_status();
  if (backend->writer_->schema_version() >= 2) {
    std::optional<storage::JobRowKey> row_key;
    if (accepting.ok()) {
      auto derived = storage::JobRowKeyOf(backend->key_);
      if (!derived.ok()) return derived.status();
      row_key = *derived;
    }
    auto table = storage::JobTable::Open(options.db_path, kLogLabel, row_key);
    if (!table.ok()) return table.status();
    backend->job_table_ = *std::move(table);
    auto lookup = storage::JobTable::Open(options.db_path, kLogLabel, std::nullopt);
    if (!lookup.ok()) return lookup.status();
    backend->job_lookup_ = *std::move(lookup);
  }
  auto jobs = JobManager::Create(
      [b = backend.get()](const JobSpec& spec, JobRun& run) {
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<JobOutcome> outcome = b->RunJob(spec, run);
        if (b->options_.observer != nullptr) {
          b->options_.observer->AuditFinished(
              outcome.ok() ? std::string_view(outcome->verdict) : "error",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              outcome.ok() ? outcome->bytes_read : 0);
        }
        return outcome;
      },
      backend->job_table_.get(), backend->job_lookup_.get(), accepting, options.workers,
      options.max_queued);
  if (!jobs.ok()) return jobs.status();
  backend->jobs_ = *std::move(jobs);
  return backend;
}

AuditBackend::AuditBackend(BackendOptions options, evidence::SigningKey key,
                           evidence::TrustStore trust, std::unique_ptr<storage::EvidenceLog> writer)
    : options_(std::move(options)),
      key_(std::move(key)),
      trust_(std::move(trust)),
      writer_(std::move(writer)),
      readers_(std::make_unique<ReaderPool>(options_.db_path)),
      index_(trust_, writer_->origin(), kVerifierId),
      fingerprinter_(options_.threads_per_audit) {
  // Gates wait for this scan; everything else works meanwhile.
  index_loader_ = std::thread([this] {
    auto reader = readers_->Open();
    if (reader.ok()) {
      index_.Load(**reader);
    } else {
      index_.Load(*writer_);  // no reader (an immutable file): the writer is idle at start
    }
  });
}

AuditBackend::~AuditBackend() {
  jobs_.reset();  // join workers before what they use goes
  if (index_loader_.joinable()) index_loader_.join();
}

void AuditBackend::CloseIdleReaders() { readers_->CloseIdle(); }

absl::Status AuditBackend::append_status() const {
  if (!writer_->append_status().ok()) return writer_->append_status();
  absl::Status index = index_.status();
  return absl::IsUnavailable(index) ? absl::OkStatus() : index;
}

absl::StatusOr<std::string> AuditBackend::CheckAllowed(const std::string& root) const {
  if (root.empty()) return absl::InvalidArgumentError("root: required");
  auto real = RealPath(root);
  if (!real.ok()) return real.status();
  for (const std::string& dir : options_.allowed_roots) {
    if (*real == dir || absl::StartsWith(*real, dir + "/")) return *real;
  }
  return absl::PermissionDeniedError(
      absl::StrCat(root, " is outside the daemon's allowed roots"));
}

absl::StatusOr<oci::Reference> AuditBackend::CheckRegistry(absl::string_view field,
                                                          const std::string& text) const {
  auto ref = oci::ParseReference(text);
  if (!ref.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", ref.status().message()));
  }
  for (const std::string& allowed : options_.allowed_registries) {
    if (ref->registry == allowed) return ref;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": registry ", ref->registry, " is not on the daemon's allowed registries (",
      options_.allowed_registries.empty() ? "none: no --allow-registry"
                                          : "--allow-registry",
      ")"));
}

absl::StatusOr<std::shared_ptr<const io::Directory>> AuditBackend::OpenAllowed(
    const std::string& root) const {
  if (root.empty()) return absl::InvalidArgumentError("root: required");
  absl::StatusOr<std::unique_ptr<io::Directory>> dir = io::RealFileSystem().OpenRoot(root);
  if (!dir.ok()) return dir.status();
  // The label is where the descriptor points (/proc/self/fd), whatever the path said.
  const std::string& real = (*dir)->label();
  for (const std::string& allowed : options_.allowed_roots) {
    if (real == allowed || absl::StartsWith(real, allowed + "/")) {
      return std::shared_ptr<const io::Directory>(*std::move(dir));
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(root, " is outside the daemon's allowed roots"));
}

absl::Status AuditBackend::CheckRootMap(const std::vector<quant::RootMapping>& map) const {
  for (const quant::RootMapping& m : map) {
    auto actual = CheckAllowed(m.actual);
    if (!actual.ok()) {
      return absl::Status(actual.status().code(),
                          absl::StrCat("root_map actual: ", actual.status().message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// The block forward's device by name; a GPU request without a usable GPU is FAILED_PRECONDITION.
absl::StatusOr<forward::ForwardDevice> ForwardDeviceOf(const std::string& name) {
  if (name.empty() || name == "cpu") return forward::CpuDevice();
  if (name != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("device: '", name, "' is not cpu or cuda"));
  }
#ifdef CKPT_HAVE_CUDA
  return gpu::OpenCudaDevice();
#else
  return absl::FailedPreconditionError("device: this ckpt-auditd was built without CUDA");
#endif
}

// The request's forward fields, before anything is queued; the layers are checked against the
// checkpoint's config when the job runs.
absl::Status CheckForwardRequest(const JobSpec& spec) {
  if (spec.forward_layers.empty()) {
    if (!spec.device.empty() || !spec.emulate.empty()) {
      return absl::InvalidArgumentError("device and emulate need forward_layers");
    }
    return absl::OkStatus();
  }
  if (spec.forward_layers.size() > 4096 ||
      (spec.forward_layers != "all" &&
       spec.forward_layers.find_first_not_of("0123456789,") != std::string::npos)) {
    return absl::InvalidArgumentError("forward_layers: expected all or L1,L2,...");
  }
  if (auto e = forward::ParseEmulation(spec.emulate); !e.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("emulate: ", e.status().message()));
  }
  return ForwardDeviceOf(spec.device).status();
}

}  // namespace

absl::StatusOr<std::string> AuditBackend::StartAudit(JobSpec spec) {
  // An oci:// tree is opened when the job runs (reading a registry is the job's work); its
  // registry is checked here, and again then.
  const bool oci_tree =
      oci::IsOciReference(spec.root) || oci::IsOciReference(spec.source_root);
  if (oci::IsOciReference(spec.root)) {
    auto ref = CheckRegistry("root", spec.root);
    if (!ref.ok()) return ref.status();
    spec.root = ref->ToString();
  } else {
    auto root = OpenAllowed(spec.root);
    if (!root.ok()) return root.status();
    spec.root_dir = *std::move(root);
    spec.root = spec.root_dir->label();
  }
  if (oci::IsOciReference(spec.source_root)) {
    auto ref = CheckRegistry("source_root", spec.source_root);
    if (!ref.ok()) return ref.status();
    spec.source_root = ref->ToString();
  } else if (!spec.source_root.empty()) {
    auto source = OpenAllowed(spec.source_root);
    if (!source.ok()) return source.status();
    spec.source_dir = *std::move(source);
    spec.source_root = spec.source_dir->label();
  }
  if (auto s = CheckRootMap(spec.root_map); !s.ok()) return s;
  if (spec.policy.empty()) spec.policy = audit::kDefaultPolicy;
  if (auto p = audit::PolicyByName(spec.policy); !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy: ", p.status().message()));
  }
  if (auto s = CheckForwardRequest(spec); !s.ok()) return s;
  if (options_.slurm == nullptr && spec.parts != 0) {
    return absl::InvalidArgumentError(
        "parts: this daemon runs audits itself (--executor local); parts need --executor slurm");
  }
  if (options_.slurm != nullptr) {
    if (oci_tree) {
      return absl::FailedPreconditionError(
          "root: oci:// trees are audited by the daemon itself (--executor local); this daemon "
          "runs audits on Slurm (--executor slurm)");
    }
    if (!spec.forward_layers.empty()) {
      return absl::FailedPreconditionError(
          "forward_layers: the block forward is not split into parts (docs/audit-parts.md); "
          "this daemon runs audits on Slurm (--executor slurm)");
    }
    auto parts = options_.slurm->PartsFor(spec.parts, spec.root, spec.source_root);
    if (!parts.ok()) return parts.status();
    spec.parts = *parts;
  }
  if (auto s = append_status(); !s.ok()) return s;
  return jobs_->Submit(std::move(spec));
}

absl::StatusOr<storage::AppendResult> AuditBackend::Append(const std::string& envelope) {
  if (auto s = append_status(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(write_mu_);
  auto appended = writer_->Append(envelope, key_);
  if (appended.ok()) index_.Appended(appended->seq, envelope, appended->checkpoint);
  return appended;
}

// The record and its test result (core/interop/publish.h). They are two appends, and the second
// may fail after the first: whatever reached the log is read back and added to the gate index,
// which must see every entry in order.
absl::StatusOr<JobOutcome> AuditBackend::Publish(const evidence::EvidenceRecord& record,
                                                 JobRun& run) {
  if (auto s = append_status(); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(write_mu_);
  // A cancel that came while the record was made (a merge of Slurm parts, say) or while this
  // waited for the lock; from here on CancelJob says it is too late.
  if (!run.Commit()) return absl::CancelledError("job cancelled; nothing was signed");
  auto before = writer_->Size();
  if (!before.ok()) return before.status();
  auto published = interop::PublishAudit(record, key_, *writer_);
  absl::Status indexed = IndexAppendedLocked(*before);
  if (!published.ok()) return published.status();
  if (!indexed.ok()) return indexed;
  uint64_t bytes_read = 0;  // what the audit read from storage, both trees (docs/evidence.md)
  for (const evidence::CheckResult& c : record.checks) {
    if (c.name == "fingerprint" && c.counts.count("bytes_read")) {
      bytes_read = static_cast<uint64_t>(c.counts.at("bytes_read"));
    }
  }
  return JobOutcome{evidence::VerdictName(record.OverallVerdict()),
                    static_cast<int64_t>(published->record_id), bytes_read};
}

absl::Status AuditBackend::IndexAppendedLocked(uint64_t from) {
  auto size = writer_->Size();
  if (!size.ok()) return size.status();
  if (*size == from) return absl::OkStatus();
  auto latest = writer_->LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  for (uint64_t seq = from; seq < *size; ++seq) {
    auto entry = writer_->Get(seq);
    if (!entry.ok()) return entry.status();
    // Only the newest checkpoint is at hand; the index checks the tree against it at the end.
    index_.Appended(seq, entry->envelope, seq + 1 == *size ? latest->second : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobOutcome> AuditBackend::RunJob(const JobSpec& spec, JobRun& run) {
  // A job submitted in this process reads through the directories opened at submission. One
  // recovered after a restart opens and checks its roots again (the allow-list may have changed,
  // and the jobs table is not signed). An oci:// tree's registry is checked again likewise,
  // before OpenOciTrees below reads it.
  audit::AuditOptions options;
  options.root_dir = spec.root_dir;
  if (oci::IsOciReference(spec.root)) {
    if (auto ref = CheckRegistry("root", spec.root); !ref.ok()) return ref.status();
    options.root = spec.root;
  } else if (options.root_dir == nullptr) {
    auto root = OpenAllowed(spec.root);
    if (!root.ok()) return root.status();
    options.root_dir = *std::move(root);
  }
  options.source_dir = spec.source_dir;
  if (oci::IsOciReference(spec.source_root)) {
    auto ref = CheckRegistry("source_root", spec.source_root);
    if (!ref.ok()) return ref.status();
    options.source = spec.source_root;
  } else if (options.source_dir == nullptr && !spec.source_root.empty()) {
    auto source = OpenAllowed(spec.source_root);
    if (!source.ok()) return source.status();
    options.source_dir = *std::move(source);
  }
  if (auto s = CheckRootMap(spec.root_map); !s.ok()) return s;
  options.root_map = spec.root_map;
  options.policy = spec.policy;
  options.threads = options_.threads_per_audit;
  options.invoker = spec.invoker;
  // A hub cache snapshot's links must lead inside the allow-list too (docs/hf-layouts.md).
  options.links.allowed = options_.allowed_roots;
  if (!spec.forward_layers.empty()) {
    // Checked again when the job starts: the GPU may be gone after a restart.
    auto device = ForwardDeviceOf(spec.device);
    if (!device.ok()) return device.status();
    auto emulation = forward::ParseEmulation(spec.emulate);
    if (!emulation.ok()) return emulation.status();
    options.forward_layers = spec.forward_layers;
    options.forward_device = *std::move(device);
    options.forward_emulation = *emulation;
  }
  // Tags resolved and recorded by digest, as the CLI's audit does.
  if (auto s = oci::OpenOciTrees(&options); !s.ok()) return s;
  if (run.Cancelled()) return absl::CancelledError("job cancelled; nothing was signed");
  absl::StatusOr<evidence::EvidenceRecord> record;
  if (spec.parts == 0) {
    record = audit::RunAudit(options, run);
  } else if (options_.slurm == nullptr) {
    return absl::FailedPreconditionError(
        "this job was submitted to run on Slurm and this daemon runs audits itself (--executor "
        "local); nothing was run");
  } else {
    // The parts name the roots by path: the real paths the job was checked against.
    options.root = options.root_dir->label();
    if (options.source_dir != nullptr) options.source = options.source_dir->label();
    record = options_.slurm->Run(spec, options, run);
    if (absl::IsCancelled(record.status())) return record.status();  // saying what of the array
  }
  if (run.Cancelled()) return absl::CancelledError("job cancelled; nothing was signed");
  if (!record.ok()) return record.status();
  absl::StatusOr<JobOutcome> outcome = Publish(*record, run);
  if (outcome.ok() && options_.attach && oci::IsOciReference(options.root)) {
    absl::StatusOr<std::vector<JobReferrer>> attached =
        Attach(options.root, outcome->record_id, run);
    if (attached.ok()) {
      outcome->referrers = *std::move(attached);
    } else {
      outcome->attach = attached.status();
    }
  }
  return outcome;
}

absl::StatusOr<std::vector<JobReferrer>> AuditBackend::Attach(const std::string& reference,
                                                              int64_t record_id, JobRun& run) {
  run.Note("attach", 0, 2, absl::StrCat("record ", record_id, " to ", reference));
  // The statements are made from the record as stored, read back through a connection of its
  // own: the pushes may take long, and the pool's readers serve calls meanwhile.
  absl::StatusOr<std::vector<oci::AttachedStatement>> attached;
  auto ref = oci::ParseReference(reference);  // by digest (OpenOciTrees)
  auto reader = readers_->Open();
  if (!ref.ok()) {
    attached = ref.status();
  } else if (!reader.ok()) {
    attached = reader.status();
  } else {
    attached = oci::AttachRecord(**reader, static_cast<uint64_t>(record_id), *ref, key_,
                                 kVerifierId);
  }
  absl::Status result = attached.status();
  std::vector<JobReferrer> referrers;
  if (!result.ok()) {
    result = absl::Status(result.code(), absl::StrCat("attach of record ", record_id, " to ",
                                                      reference, " failed (the record stays "
                                                      "in the log): ", result.message()));
    run.Note("attach", 0, 2, std::string(result.message()));
  } else {
    std::string pushed;
    for (const oci::AttachedStatement& st : *attached) {
      absl::StrAppend(&pushed, pushed.empty() ? "" : ", ", st.referrer.digest, " (",
                      st.predicate_type, st.referrer.referrers_api ? ", referrers API" : "",
                      ")");
      referrers.push_back({st.referrer.digest, st.predicate_type, st.referrer.referrers_api});
    }
    run.Note("attach", attached->size(), 2, absl::StrCat("attached ", pushed));
  }
  if (options_.observer != nullptr) options_.observer->Attached(run.id(), reference, result);
  if (!result.ok()) return result;
  return referrers;
}

absl::StatusOr<std::string> AuditBackend::ReadVerifiedEntry(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(envelope_mu_);
    auto it = envelopes_.find(seq);
    if (it != envelopes_.end()) return it->second;
  }
  auto entry = readers_->With<storage::LogEntry>(
      [&](storage::EvidenceLog& log) { return log.Get(seq); });
  if (!entry.ok()) return entry.status();
  if (auto s = index_.CheckEntry(seq, entry->envelope); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(envelope_mu_);
  if (envelope_bytes_ + entry->envelope.size() > kMaxCachedEnvelopeBytes) {
    envelopes_.clear();
    envelope_bytes_ = 0;
  }
  if (entry->envelope.size() <= kMaxCachedEnvelopeBytes &&
      envelopes_.emplace(seq, entry->envelope).second) {
    envelope_bytes_ += entry->envelope.size();
  }
  return std::move(entry->envelope);
}

absl::StatusOr<GatePolicy> AuditBackend::PolicyFor(std::shared_ptr<const io::Directory> root,
                                                   const Content& content,
                                                   const GateRequest& request,
                                                   const std::string& scale_policy,
                                                   Progress& progress) {
  GatePolicy policy;
  policy.scale_policy = scale_policy;
  policy.source_manifest_root = request.source_manifest_root;
  // A format is a function of the bytes, so it is cached by content (and mapping).
  const std::string key =
      absl::StrCat(ToHex(ContentKeyOf(content.Subjects())), "\n", MapKey(request.root_map));
  {
    std::lock_guard<std::mutex> lock(format_mu_);
    auto it = formats_.find(key);
    if (it != formats_.end()) {
      policy.requirement = RequirementOf(it->second.first, it->second.second);
      policy.format = quant::QuantFormatName(it->second.first);
      return policy;
    }
  }
  // Headers and small files only (config, index, manifests): metadata, not tensor bytes.
  ReadOptions read = Checkpoint::ReadOnly();
  read.keep = ReadOptions::Keep::kMetadata;
  read.threads = options_.threads_per_audit;
  LinkOptions links;
  links.allowed = options_.allowed_roots;  // as the content was listed (docs/hf-layouts.md)
  auto listing = ListLayout(std::move(root), links);
  if (!listing.ok()) return listing.status();
  auto read_tree = ReadTree(std::move(listing->listing), read, progress);
  if (!read_tree.ok()) return read_tree.status();
  auto ckpt = Checkpoint::Open(*std::move(read_tree));
  if (!ckpt.ok()) {
    if (absl::IsDataLoss(ckpt.status())) return ckpt.status();  // changed while read
    policy.requirement = GateRequirement::kNone;
    policy.format = absl::StrCat("an unreadable checkpoint (", ckpt.status().message(), ")");
    return policy;
  }
  // The format must be that of the files fingerprinted, not of a tree swapped in meanwhile.
  const TreeImage& image = (*ckpt)->image();
  bool same = image.files.size() == content.files.size();
  for (size_t i = 0; same && i < image.files.size(); ++i) {
    same = image.files[i].name == content.files[i].path &&
           image.files[i].identity == content.files[i].identity;
  }
  if (!same) {
    return absl::AbortedError("the checkpoint changed while the gate ran; nothing was decided");
  }
  quant::FormatOptions fo;
  fo.root_map = request.root_map;
  quant::FormatReport report = quant::DetectFormat(**ckpt, fo);
  policy.requirement = RequirementOf(report.format, report.x4t_sidecars);
  policy.format = quant::QuantFormatName(report.format);
  std::lock_guard<std::mutex> lock(format_mu_);
  if (formats_.size() >= kMaxCachedFormats) formats_.clear();
  formats_[key] = {report.format, report.x4t_sidecars};
  return policy;
}

absl::StatusOr<GateDecision> AuditBackend::Gate(const GateRequest& request, Progress& progress) {
  auto dir = OpenAllowed(request.root);
  if (!dir.ok()) return dir.status();
  const std::string real = (*dir)->label();
  if (auto s = CheckRootMap(request.root_map); !s.ok()) return s;
  const std::string scale_policy = request.policy.empty() ? audit::kDefaultPolicy : request.policy;
  if (auto p = audit::PolicyByName(scale_policy); !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("policy: ", p.status().message()));
  }
  if (auto s = index_.WaitReady(progress); !s.ok()) return s;
  LinkOptions links;
  links.allowed = options_.allowed_roots;  // link targets too (docs/hf-layouts.md)
  auto content = fingerprinter_.Fingerprint(*dir, progress, links);
  if (!content.ok()) return content.status();
  auto policy = PolicyFor(*dir, *content, request, scale_policy, progress);
  if (!policy.ok()) return policy.status();

  const std::vector<evidence::Subject> subjects = content->Subjects();
  const ContentKey key = ContentKeyOf(subjects);
  GateOutcome outcome = Decide(*policy, index_.Audits(key));
  GateDecision d;
  d.pass = outcome.pass;
  d.reasons = std::move(outcome.reasons);
  d.manifest_root = ToHex(content->manifest_root);
  d.policy_uri = policy->Uri();
  d.source_manifest_root = outcome.source_manifest_root;
  d.hashed_bytes = content->hashed_bytes;
  std::string input_uri, input_sha256;
  if (outcome.record) {
    d.record_id = static_cast<int64_t>(outcome.record->seq);
    input_uri = absl::StrCat(index_.origin(), "#", outcome.record->seq);
    input_sha256 = outcome.record->envelope_sha256;
    if (!d.pass) {  // the failing checks' first findings, from the verified payload
      auto envelope = ReadVerifiedEntry(outcome.record->seq);
      if (!envelope.ok()) return envelope.status();
      auto parsed = evidence::ParseEnvelope(*envelope);
      if (parsed.ok()) {
        for (auto& r : FailureReasons(parsed->payload)) d.reasons.push_back(std::move(r));
      }
    }
  }
  if (progress.Cancelled()) return absl::CancelledError("gate cancelled; nothing was signed");

  const std::string resource_uri = absl::StrCat("file://", EncodeName(real));
  std::unique_lock<std::mutex> lock(decision_mu_);
  std::optional<DecisionFacts> last = index_.LatestDecision(key, d.policy_uri, resource_uri);
  if (last && last->pass == d.pass && last->input_seq == d.record_id &&
      last->source_manifest_root == d.source_manifest_root &&
      Within(last->time, options_.decision_reuse)) {
    lock.unlock();  // the decision exists; reading it back needs no exclusion
    d.reused = true;
    d.decision_id = static_cast<int64_t>(last->seq);
    auto envelope = ReadVerifiedEntry(last->seq);
    if (!envelope.ok()) return envelope.status();
    d.envelope = *std::move(envelope);
  } else {
    evidence::EvidenceRecord decision;
    decision.root = real;
    decision.policy = {policy->Name(), "1", nlohmann::ordered_json::object(), d.policy_uri};
    decision.environment = evidence::CollectEnvironment();
    decision.started_at = decision.finished_at = evidence::Rfc3339Now();
    decision.subjects = subjects;
    decision.invoker = request.invoker;
    if (!d.source_manifest_root.empty()) {  // named even when unpinned (docs/daemon.md)
      decision.source = evidence::SourceBinding{"", d.source_manifest_root, {}};
    }
    evidence::CheckResult gate;
    gate.name = "gate";
    gate.verdict = d.pass ? evidence::Verdict::kPass : evidence::Verdict::kFail;
    decision.checks.push_back(std::move(gate));
    auto payload =
        evidence::VerificationSummaryPayload(decision, kVerifierId, input_uri, input_sha256);
    if (!payload.ok()) return payload.status();
    auto envelope = evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, key_);
    if (!envelope.ok()) return envelope.status();
    d.envelope = *std::move(envelope);
    auto appended = Append(d.envelope);
    if (!appended.ok()) return appended.status();
    d.decision_id = static_cast<int64_t>(appended->seq);
    lock.unlock();
  }
  auto proof = index_.Prove(static_cast<uint64_t>(d.decision_id));
  if (!proof.ok()) return proof.status();
  d.proof = {proof->leaf_index, proof->tree_size, std::move(proof->hashes), proof->root,
             std::move(proof->checkpoint)};
  if (options_.observer != nullptr) options_.observer->GateDecided(d.pass);
  return d;
}

absl::StatusOr<storage::QueryPage> AuditBackend::Query(const storage::QueryFilter& filter) {
  return readers_->With<storage::QueryPage>(
      [&](storage::EvidenceLog& log) { return log.Query(filter); });
}

absl::StatusOr<storage::LogEntry> AuditBackend::GetRecord(uint64_t id) {
  return readers_->With<storage::LogEntry>(
      [&](storage::EvidenceLog& log) { return log.Get(id); });
}

absl::StatusOr<storage::LogVerification> AuditBackend::VerifyLog(bool incremental) {
  // A connection of its own: the run holds one read snapshot for as long as it takes, and
  // appends and other reads go on beside it (WAL).
  auto reader = readers_->Open();
  if (!reader.ok()) return reader.status();
  std::unique_lock<std::mutex> serial(verify_mu_, std::defer_lock);
  storage::VerifiedLogState from;
  if (incremental) {
    serial.lock();
    std::lock_guard<std::mutex> lock(verify_state_mu_);
    from = verified_;
  }
  storage::VerifiedLogState state;
  auto result = storage::VerifyLogFrom(**reader, trust_, std::move(from), &state);
  if (result.ok() && result->ok()) {
    std::lock_guard<std::mutex> lock(verify_state_mu_);
    if (state.size >= verified_.size) verified_ = std::move(state);
  }
  return result;
}

std::optional<AuditFacts> AuditBackend::RecordFacts(int64_t id) const {
  if (id < 0) return std::nullopt;
  return index_.AuditAt(static_cast<uint64_t>(id));
}

absl::StatusOr<InclusionProofResult> AuditBackend::InclusionProof(uint64_t id) {
  return readers_->With<InclusionProofResult>(
      [&](storage::EvidenceLog& log) -> absl::StatusOr<InclusionProofResult> {
        InclusionProofResult r;
        absl::Status s = log.InReadTransaction([&]() -> absl::Status {
          auto latest = log.LatestCheckpoint();
          if (!latest.ok()) return latest.status();
          r.leaf_index = id;
          r.tree_size = latest->first;
          r.checkpoint = latest->second;
          if (id >= r.tree_size) {
            return absl::NotFoundError(
                absl::StrCat("no record ", id, " in a log of ", r.tree_size));
          }
          auto hashes = log.InclusionProof(id, r.tree_size);
          if (!hashes.ok()) return hashes.status();
          r.hashes = *std::move(hashes);
          auto root = log.RootAt(r.tree_size);
          if (!root.ok()) return root.status();
          r.root = *root;
          return absl::OkStatus();
        });
        if (!s.ok()) return s;
        return r;
      });
}

}  // namespace ckpt::daemon
