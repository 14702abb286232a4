#include "core/audit/audit_checks.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/audit/audit_run.h"
#include "core/audit/engine.h"
#include "core/audit/forward_check.h"
#include "core/audit/layout_check.h"
#include "core/audit/pair_check.h"
#include "core/audit/scale_window_check.h"
#include "core/audit/weight_files.h"
#include "core/evidence/environment.h"
#include "core/text/name_encoding.h"

namespace ckpt::audit {

using evidence::CheckResult;

std::vector<std::string> PolicyNames() { return {"scale-window", "marlin-safe"}; }

absl::StatusOr<quant::ScaleWindowConfig> PolicyByName(const std::string& name) {
  quant::ScaleWindowConfig c;
  if (name == "scale-window") return c;
  if (name == "marlin-safe") {
    c.name = "marlin-safe";
    c.max_span = c.marlin_span - 1;
    return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown policy '", name, "'; known: ",
                                                 absl::StrJoin(PolicyNames(), ", ")));
}

CheckResult RecordOf(const Fingerprint& fp) {
  CheckResult c;
  c.name = "fingerprint";
  uint64_t bytes = 0;
  for (const FileFingerprint& f : fp.files) bytes += f.size;
  c.counts["files"] = static_cast<int64_t>(fp.files.size());
  c.counts["file_bytes"] = static_cast<int64_t>(bytes);
  c.counts["hashed_bytes"] = static_cast<int64_t>(fp.hashed_bytes);
  c.details.Set("manifest_algorithm", std::string(fp.manifest.Algorithm()));
  c.details.Set("manifest_root", fp.manifest.RootHex());
  return c;
}

evidence::PolicyRef PolicyRefOf(const quant::ScaleWindowConfig& policy) {
  return evidence::ScaleWindowPolicyRef(ThresholdsOf(policy));
}

absl::StatusOr<std::vector<evidence::Subject>> SubjectsOf(const Fingerprint& fp) {
  std::vector<evidence::Subject> subjects;
  for (const FileFingerprint& f : fp.files) {
    if (absl::Status s = evidence::CheckFileSubjectName(fp.root, f.path); !s.ok()) return s;
    if (f.sha256) subjects.push_back({f.path, ToHex(*f.sha256)});
  }
  subjects.push_back({evidence::kManifestRootSubject, fp.manifest.RootHex()});
  return subjects;
}

namespace {

// A Hugging Face layout's own check (on the digests of the whole read), and its repo and
// commit as the model (source) ref unless the caller gave one (docs/hf-layouts.md).
void AddLayoutCheck(const char* name, const LayoutInfo& layout, const TreeImage& image,
                    std::string* ref, evidence::EvidenceRecord* rec) {
  if (layout.kind != TreeLayout::kPlain) rec->checks.push_back(LayoutCheck(name, layout, image));
  if (ref->empty()) *ref = layout.ModelRef();
}

}  // namespace

namespace {

quant::PairVerifyOptions PairOptionsOf(const AuditOptions& options) {
  quant::PairVerifyOptions popt;
  popt.threads = options.threads;
  popt.format.root_map = options.root_map;
  return popt;
}

forward::ForwardAuditOptions ForwardOptionsOf(const AuditOptions& options) {
  forward::ForwardAuditOptions fopt;
  fopt.precision = options.forward_device.name == "cpu" ? forward::Precision::kF64
                                                        : forward::Precision::kBF16;
  // Audits always measure the vLLM w1/w3 global-scale collapse (docs/forward.md; free when no
  // NVFP4 expert's w1 and w3 global scales differ), unless another emulation is asked for.
  fopt.emulation = options.forward_emulation == forward::Emulation::kNone
                       ? forward::Emulation::kVllmW13Collapse
                       : options.forward_emulation;
  return fopt;
}

// A tree read from an OCI artifact: every raw layer's digest must be the SHA-256 the engine
// took from the bytes it read (those the verdicts were computed from), and the manifest digest
// becomes `oci_manifest` and joins the subjects (docs/interop.md, "How digests bind"). A layer
// file the walk ignored was never read and names no subject; the manifest digest still covers it.
absl::Status Bind(const std::optional<ReadBinding>& binding, const TreeImage& image,
                  std::vector<evidence::Subject>* subjects, std::string* oci_manifest) {
  if (!binding) return absl::OkStatus();
  for (const auto& [name, want] : binding->file_sha256) {
    const ImageFile* f = image.Find(name);
    if (f == nullptr) continue;
    std::string got = f->sha256 ? ToHex(*f->sha256) : "(not hashed)";
    if (got != want) {
      return absl::DataLossError(absl::StrCat(
          image.root, "/", name, ": the bytes read hash to sha256:", got,
          ", the manifest's layer digest is sha256:", want, " (a tampered layer); nothing signed"));
    }
  }
  subjects->push_back({evidence::kOciManifestSubject, binding->manifest_digest.substr(7)});
  *oci_manifest = binding->manifest_digest;
  return absl::OkStatus();
}

}  // namespace

AuditRun::AuditRun(const AuditOptions& options, const quant::ScaleWindowConfig& policy)
    : options_(options),
      window_(policy),
      pair_(PairOptionsOf(options)),
      forward_(options.forward_layers, ForwardOptionsOf(options), options.forward_device) {}

absl::StatusOr<std::unique_ptr<AuditRun>> AuditRun::Open(const AuditOptions& options,
                                                        Progress& progress,
                                                        bool tensor_digests) {
  auto policy = PolicyByName(options.policy);
  if (!policy.ok()) return policy.status();
  std::unique_ptr<AuditRun> run(new AuditRun(options, *policy));
  evidence::EvidenceRecord& rec = run->rec_;
  rec.started_at = evidence::Rfc3339Now();
  rec.environment = evidence::CollectEnvironment();
  rec.policy = PolicyRefOf(*policy);
  rec.refs = options.refs;
  rec.invoker = options.invoker;

  EngineOptions eopt;
  eopt.root = options.root;
  eopt.source = options.source;
  eopt.root_dir = options.root_dir;
  eopt.source_dir = options.source_dir;
  eopt.links = options.links;
  eopt.threads = options.threads;
  eopt.memory_window = options.memory_window;
  eopt.tensor_digests = tensor_digests;
  auto engine = Engine::Open(eopt, progress);
  if (!engine.ok()) return engine.status();
  // A tree the strict reader refuses is no checkpoint to judge: an error naming the file and
  // why, before anything more is read, and no record (docs/audit-engine.md, "Not a checkpoint").
  for (const TreeHeaders* tree : {&(*engine)->root(),
                                 (*engine)->has_source() ? &(*engine)->source() : nullptr}) {
    if (tree == nullptr || tree->checkpoint != nullptr) continue;
    const absl::Status& why = tree->checkpoint_status;
    return absl::Status(why.code(), absl::StrCat(tree == &(*engine)->root() ? "" : "source: ",
                                                 "not a checkpoint the strict reader accepts: ",
                                                 why.message(), "; nothing was signed"));
  }
  run->engine_ = *std::move(engine);
  return run;
}

std::vector<Check*> AuditRun::checks() {
  // Every check plans from the headers and consumes its tensors as the one read streams them
  // past (docs/audit-engine.md).
  std::vector<Check*> checks = {&window_, &pair_};
  if (!options_.forward_layers.empty()) checks.push_back(&forward_);
  return checks;
}

absl::StatusOr<evidence::EvidenceRecord> RunAudit(const AuditOptions& options,
                                                  Progress& progress, AuditStats* stats) {
  auto run = AuditRun::Open(options, progress);
  if (!run.ok()) return run.status();
  auto streamed = (*run)->engine().Run((*run)->checks(), progress);
  if (!streamed.ok()) return streamed.status();
  uint64_t bytes_read = 0;
  for (const auto& image : streamed->images) bytes_read += image->bytes_read;
  if (stats != nullptr) {
    *stats = {bytes_read, streamed->peak_kept_bytes, streamed->reread_tensors,
              streamed->reread_bytes};
  }
  auto rec = std::move(**run).Record(streamed->images, bytes_read);
  if (rec.ok() && streamed->reread_tensors > 0) {
    // Tensors the window made the cursor pass and read again (docs/audit-engine.md), counted
    // in bytes_read too.
    evidence::CheckResult& fingerprint = rec->checks.front();
    fingerprint.counts["reread_tensors"] = static_cast<int64_t>(streamed->reread_tensors);
    fingerprint.counts["reread_bytes"] = static_cast<int64_t>(streamed->reread_bytes);
  }
  return rec;
}

absl::StatusOr<evidence::EvidenceRecord> AuditRun::Record(
    const std::vector<std::shared_ptr<const TreeImage>>& images, uint64_t bytes_read) && {
  evidence::EvidenceRecord rec = std::move(rec_);
  const Engine& e = *engine_;
  const Checkpoint* ckpt = e.root().checkpoint.get();
  const TreeImage& derived_read = *images[0];
  const Fingerprint derived_fp = FingerprintOf(derived_read, e.root().walk.ignore_paths);
  rec.root = derived_read.RootPath();
  auto subjects = SubjectsOf(derived_fp);
  if (!subjects.ok()) return subjects.status();
  rec.subjects = *std::move(subjects);
  if (absl::Status s = Bind(options_.root_binding, derived_read, &rec.subjects, &rec.oci_manifest);
      !s.ok()) {
    return s;
  }
  rec.checks.push_back(RecordOf(derived_fp));
  if (e.has_source()) {
    const TreeImage& source_read = *images[1];
    const Fingerprint source_fp = FingerprintOf(source_read, e.source().walk.ignore_paths);
    auto files = SubjectsOf(source_fp);
    if (!files.ok()) return files.status();
    files->pop_back();  // the manifest ROOT has its own field
    std::string oci_manifest;
    if (absl::Status s = Bind(options_.source_binding, source_read, &*files, &oci_manifest);
        !s.ok()) {
      return s;
    }
    rec.source = evidence::SourceBinding{source_read.RootPath(), source_fp.manifest.RootHex(),
                                         *std::move(files), std::move(oci_manifest)};
  }
  // Storage bytes read by the whole audit (both trees): each byte once, and what the window
  // made the stream read again (docs/audit-engine.md, "Any tensor order").
  rec.checks.front().counts["bytes_read"] = static_cast<int64_t>(bytes_read);
  AddLayoutCheck("hf_layout", e.root().layout, derived_read, &rec.refs.model_ref, &rec);
  if (e.has_source()) {
    AddLayoutCheck("source_hf_layout", e.source().layout, *images[1], &rec.refs.source_ref,
                   &rec);
  }
  CheckResult structure;  // both trees opened as checkpoints (AuditRun::Open)
  structure.name = "checkpoint_structure";
  structure.counts["shards"] = static_cast<int64_t>(ckpt->shards().size());
  structure.counts["tensors"] = static_cast<int64_t>(ckpt->TensorNames().size());
  structure.counts["tensor_bytes"] = static_cast<int64_t>(ckpt->total_tensor_bytes());
  structure.details.Set("layout", std::string(LayoutName(ckpt->layout())));
  AddUncheckedWeightFiles(*ckpt, &structure);  // fails for weights a loader reads unchecked
  rec.checks.push_back(std::move(structure));
  rec.checks.push_back(RecordOf(std::move(window_).Result()));
  if (pair_.planned()) {
    quant::PairVerifyResult r = std::move(pair_).Result();
    rec.checks.push_back(RecordOf(r));
    if (!options_.root_map.empty()) {  // what the X4T checkpoint_root was compared with
      std::vector<std::string> maps;
      for (const quant::RootMapping& m : options_.root_map) {
        maps.push_back(EncodeName(m.declared) + "=" + EncodeName(m.actual));
      }
      rec.checks.back().details.Set("root_map", std::move(maps));
    }
    rec.pair_audit = PairAuditOf(r);
  }
  if (forward_.planned()) {
    absl::StatusOr<forward::ForwardAuditResult> r = std::move(forward_).Result();
    if (!r.ok()) return r.status();
    rec.checks.push_back(RecordOf(*r));
    rec.block_forward = std::move(r->report);
    if (const auto& g = options_.forward_device.gpu) {
      rec.environment.gpu = evidence::GpuInfo{g->name, g->sm, g->driver, g->cuda};
    }
  }
  // Every verdict above was computed from the bytes read; the names must still lead to them.
  for (const auto& image : images) {
    if (absl::Status s = image->CheckUnchanged(); !s.ok()) return s;
  }
  rec.finished_at = evidence::Rfc3339Now();
  return rec;
}

}  // namespace ckpt::audit
