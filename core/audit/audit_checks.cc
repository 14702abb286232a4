#include "core/audit/audit_checks.h"

#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/audit/layout_check.h"
#include "core/checkpoint.h"
#include "core/evidence/environment.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"

namespace ckpt::audit {
namespace {

using evidence::CheckResult;
using evidence::Verdict;
using ojson = nlohmann::ordered_json;

ojson Ordered(const nlohmann::json& j) { return ojson::parse(DumpJson(j)); }

void AddFindings(const quant::FindingList& list, CheckResult* c) {
  for (const quant::Finding& f : list.kept()) c->findings.push_back(Ordered(f.ToJson()));
}

// "L12" for any tensor under "layers.12.", else the tensor name itself.
std::string LayerLabel(const std::string& tensor) {
  static const std::regex kLayer(R"(layers\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(tensor, m, kLayer)) return absl::StrCat("L", m[1].str());
  return tensor;
}

}  // namespace

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

CheckResult FingerprintCheck(const Fingerprint& fp) {
  CheckResult c;
  c.name = "fingerprint";
  uint64_t bytes = 0;
  for (const FileFingerprint& f : fp.files) bytes += f.size;
  c.counts["files"] = static_cast<int64_t>(fp.files.size());
  c.counts["file_bytes"] = static_cast<int64_t>(bytes);
  c.counts["hashed_bytes"] = static_cast<int64_t>(fp.hashed_bytes);
  c.details = {{"manifest_algorithm", fp.manifest.Algorithm()},
               {"manifest_root", fp.manifest.RootHex()}};
  return c;
}

CheckResult ScaleWindowCheck(const quant::ScaleWindowResult& r) {
  CheckResult c;
  c.name = "scale_window";
  switch (r.verdict) {
    case quant::ScaleWindowVerdict::kLosslessTranscodable: c.verdict = Verdict::kPass; break;
    case quant::ScaleWindowVerdict::kOverSpan:
    case quant::ScaleWindowVerdict::kNaNScale: c.verdict = Verdict::kFail; break;
    case quant::ScaleWindowVerdict::kNotMxfp4:
    case quant::ScaleWindowVerdict::kNoQuantizedTensors: c.verdict = Verdict::kSkipped; break;
  }
  c.counts["tensors"] = static_cast<int64_t>(r.tensors.size());
  c.counts["over_span_groups"] = static_cast<int64_t>(r.over_span.total());
  c.counts["nan_scales"] = static_cast<int64_t>(r.nan_scales.total());
  c.counts["hazards"] = static_cast<int64_t>(r.hazards.total());
  c.counts["zero_groups_out_of_window"] = static_cast<int64_t>(r.zero_groups_out_of_window);
  AddFindings(r.over_span, &c);
  AddFindings(r.nan_scales, &c);
  AddFindings(r.hazards, &c);
  c.findings_total = r.over_span.total() + r.nan_scales.total() + r.hazards.total();
  // Per layer: the widest exponent span of any tensor, against the policy's window.
  std::map<std::string, int> span_by_layer;
  std::vector<std::string> order;
  for (const quant::TensorScaleStats& t : r.tensors) {
    if (!t.k_min || !t.pair_k_max) continue;
    std::string label = LayerLabel(t.tensor);
    auto [it, fresh] = span_by_layer.emplace(label, t.span());
    if (fresh) order.push_back(label);
    else it->second = std::max(it->second, t.span());
  }
  if (!order.empty()) {
    ojson points = ojson::array();
    for (const std::string& l : order) points.push_back({{"label", l}, {"value", span_by_layer[l]}});
    c.series.push_back({{"title", "Scale exponent span per layer"},
                        {"unit", "k_max - k_min (powers of two)"},
                        {"limit", r.config.max_span},
                        {"warn", r.config.marlin_span},
                        {"points", points}});
  }
  c.details = {{"verdict", quant::VerdictName(r.verdict)}, {"policy", Ordered(r.config.ToJson())}};
  return c;
}

CheckResult PairCheck(const quant::PairVerifyResult& r) {
  CheckResult c;
  c.name = "pair_verify";
  c.verdict = r.lossless ? Verdict::kPass : Verdict::kFail;
  c.counts["quantized_tensors"] = static_cast<int64_t>(r.quantized_tensors);
  c.counts["packed_bytes_compared"] = static_cast<int64_t>(r.packed_bytes_compared);
  c.counts["value_blocks_compared"] = static_cast<int64_t>(r.value_blocks_compared);
  c.counts["ignored_tensors_compared"] = static_cast<int64_t>(r.ignored_tensors_compared);
  c.counts["fused_groups_checked"] = static_cast<int64_t>(r.fused_groups_checked);
  c.counts["zero_groups_canonicalized"] = static_cast<int64_t>(r.zero_groups_canonicalized);
  c.counts["mismatches"] = static_cast<int64_t>(r.mismatches.total());
  AddFindings(r.mismatches, &c);
  c.findings_total = r.mismatches.total();
  ojson points = ojson::array();
  for (const auto& [code, n] : r.mismatches.by_code()) {
    points.push_back({{"label", code}, {"value", n}});
  }
  if (!points.empty()) {
    c.series.push_back({{"title", "Pair mismatches by kind"}, {"unit", "count"}, {"points", points}});
  }
  c.details = {{"derived_kind", r.derived_kind}, {"verdict", r.verdict()}};
  return c;
}

CheckResult ForwardCheck(const forward::ForwardAuditResult& r) {
  CheckResult c;
  c.name = "block_forward";
  c.verdict = r.passed ? Verdict::kPass : Verdict::kFail;
  const nlohmann::json& rep = r.report;
  if (rep.contains("determinism")) {
    c.counts["rerun_differing_elements"] = rep["determinism"].value("differing_elements", 0);
  }
  if (rep.contains("source_vs_derived") && rep["source_vs_derived"].contains("tensors")) {
    ojson points = ojson::array();
    for (const auto& [name, t] : rep["source_vs_derived"]["tensors"].items()) {
      int64_t differing = t.value("differing_elements", int64_t{0});
      c.counts[absl::StrCat(name, "_differing_elements")] = differing;
      points.push_back({{"label", name}, {"value", differing}});
      if (differing > 0) {
        c.findings.push_back({{"code", "block-output-differs"},
                              {"tensor", name},
                              {"message", absl::StrCat(differing, " of ", t.value("elements", 0),
                                                       " elements differ, max |diff| ",
                                                       t.value("max_abs_diff", "?"))}});
      }
    }
    c.series.push_back({{"title", "Block outputs differing from the source (elements)"},
                        {"unit", "elements"},
                        {"points", points}});
  }
  c.details = {{"verdict", rep.value("verdict", "")}, {"layer", rep.value("layer", -1)}};
  return c;
}

evidence::PolicyRef PolicyRefOf(const quant::ScaleWindowConfig& policy) {
  return {policy.name, std::to_string(policy.version), Ordered(policy.ToJson())};
}

std::vector<evidence::Subject> SubjectsOf(const Fingerprint& fp) {
  std::vector<evidence::Subject> subjects;
  for (const FileFingerprint& f : fp.files) {
    if (f.sha256) subjects.push_back({f.path, ToHex(*f.sha256)});
  }
  subjects.push_back({evidence::kManifestRootSubject, fp.manifest.RootHex()});
  return subjects;
}

namespace {

// One tree, read once: its image and fingerprint.
struct ReadRoot {
  std::shared_ptr<const TreeImage> image;
  Fingerprint fingerprint;
  LayoutInfo layout;
};

absl::StatusOr<ReadRoot> Read(const std::string& path, std::shared_ptr<const io::Directory> dir,
                              const AuditOptions& options, uint64_t window, Progress& progress) {
  if (dir == nullptr) {
    absl::StatusOr<std::unique_ptr<io::Directory>> opened = io::RealFileSystem().OpenRoot(path);
    if (!opened.ok()) return opened.status();
    dir = *std::move(opened);
  }
  absl::StatusOr<LayoutListing> listing = ListLayout(std::move(dir), options.links);
  if (!listing.ok()) return listing.status();
  ReadOptions read;
  read.threads = options.threads;
  read.memory_window = window;
  read.tensor_digests = false;  // the record names files and the manifest ROOT, not tensors
  absl::StatusOr<std::shared_ptr<const TreeImage>> image =
      ReadTree(std::move(listing->listing), read, progress);
  if (!image.ok()) return image.status();
  return ReadRoot{*image, FingerprintOf(**image, listing->walk.ignore_paths),
                  std::move(listing->layout)};
}

// A checkpoint the strict reader refused, as a finding: the message names the file, the
// tensor and the offset.
ojson Unreadable(const absl::Status& s) {
  return {{"code", "unreadable-checkpoint"},
          {"status", absl::StatusCodeToString(s.code())},
          {"message", std::string(s.message())}};
}

// A Hugging Face layout's own check, and its repo and commit as the model (source) ref unless
// the caller gave one (docs/hf-layouts.md).
void AddLayoutChecks(const ReadRoot& derived, const ReadRoot* source,
                     evidence::EvidenceRecord* rec) {
  if (derived.layout.kind != TreeLayout::kPlain) {
    rec->checks.push_back(LayoutCheck("hf_layout", derived.layout, *derived.image));
  }
  if (rec->refs.model_ref.empty()) rec->refs.model_ref = derived.layout.ModelRef();
  if (source == nullptr) return;
  if (source->layout.kind != TreeLayout::kPlain) {
    rec->checks.push_back(LayoutCheck("source_hf_layout", source->layout, *source->image));
  }
  if (rec->refs.source_ref.empty()) rec->refs.source_ref = source->layout.ModelRef();
}

}  // namespace

absl::StatusOr<evidence::EvidenceRecord> RunAudit(const AuditOptions& options,
                                                  Progress& progress) {
  auto policy = PolicyByName(options.policy);
  if (!policy.ok()) return policy.status();
  evidence::EvidenceRecord rec;
  rec.started_at = evidence::Rfc3339Now();
  rec.environment = evidence::CollectEnvironment();
  rec.policy = PolicyRefOf(*policy);
  rec.refs = options.refs;
  rec.invoker = options.invoker;

  auto derived = Read(options.root, options.root_dir, options, options.memory_window, progress);
  if (!derived.ok()) return derived.status();
  rec.root = derived->image->root;
  rec.subjects = SubjectsOf(derived->fingerprint);
  rec.checks.push_back(FingerprintCheck(derived->fingerprint));
  uint64_t bytes_read = derived->image->bytes_read;
  std::optional<ReadRoot> source;
  if (!options.source.empty() || options.source_dir != nullptr) {
    const uint64_t kept = derived->image->kept_bytes;
    const uint64_t left = options.memory_window > kept ? options.memory_window - kept : 0;
    auto s = Read(options.source, options.source_dir, options, left, progress);
    if (!s.ok()) return s.status();
    source = *std::move(s);
    bytes_read += source->image->bytes_read;
    std::vector<evidence::Subject> files = SubjectsOf(source->fingerprint);
    files.pop_back();  // the manifest ROOT has its own field
    rec.source = evidence::SourceBinding{source->image->root,
                                         source->fingerprint.manifest.RootHex(),
                                         std::move(files)};
  }

  // Storage bytes read by the whole audit (both trees): each byte once.
  rec.checks.front().counts["bytes_read"] = static_cast<int64_t>(bytes_read);
  AddLayoutChecks(*derived, source ? &*source : nullptr, &rec);

  CheckResult structure;
  structure.name = "checkpoint_structure";
  auto ckpt = Checkpoint::Open(derived->image);
  if (!ckpt.ok()) {
    structure.verdict = evidence::Verdict::kFail;
    structure.findings.push_back(Unreadable(ckpt.status()));
    rec.checks.push_back(structure);
  } else {
    structure.counts["shards"] = static_cast<int64_t>((*ckpt)->shards().size());
    structure.counts["tensors"] = static_cast<int64_t>((*ckpt)->TensorNames().size());
    structure.counts["tensor_bytes"] = static_cast<int64_t>((*ckpt)->total_tensor_bytes());
    structure.details = {{"layout", std::string(LayoutName((*ckpt)->layout()))}};
    rec.checks.push_back(structure);

    auto window = quant::ScaleWindowPolicy(*policy).Check(**ckpt, progress, options.threads);
    if (!window.ok()) return window.status();
    rec.checks.push_back(ScaleWindowCheck(*window));
  }

  std::unique_ptr<Checkpoint> source_ckpt;
  if (source) {
    auto opened = Checkpoint::Open(source->image);
    if (!opened.ok()) {
      CheckResult pair;
      pair.name = "pair_verify";
      pair.verdict = evidence::Verdict::kFail;
      ojson f = Unreadable(opened.status());
      f["code"] = "unreadable-source";
      pair.findings.push_back(f);
      rec.checks.push_back(pair);
    } else {
      source_ckpt = *std::move(opened);
    }
  }
  if (ckpt.ok() && source_ckpt != nullptr) {
    quant::PairVerifyOptions popt;
    popt.threads = options.threads;
    popt.format.root_map = options.root_map;
    auto pair = quant::VerifyPair(*source_ckpt, **ckpt, popt, progress);
    if (!pair.ok()) return pair.status();
    rec.checks.push_back(PairCheck(*pair));
    if (!options.root_map.empty()) {  // what the X4T checkpoint_root was compared with
      ojson maps = ojson::array();
      for (const quant::RootMapping& m : options.root_map) {
        maps.push_back(EncodeName(m.declared) + "=" + EncodeName(m.actual));
      }
      rec.checks.back().details["root_map"] = std::move(maps);
    }
    rec.pair_audit = Ordered(pair->ToJson());
  }
  if (ckpt.ok() && options.forward_layer >= 0) {
    forward::ForwardAuditOptions fopt;
    fopt.layer = options.forward_layer;
    auto fwd = forward::RunForwardAudit(**ckpt, source_ckpt.get(), fopt, forward::CpuDevice());
    if (!fwd.ok()) return fwd.status();
    rec.checks.push_back(ForwardCheck(*fwd));
    rec.block_forward = Ordered(fwd->report);
  }
  // Every verdict above was computed from the bytes read; the names must still lead to them.
  if (auto s = derived->image->CheckUnchanged(); !s.ok()) return s;
  if (source) {
    if (auto s = source->image->CheckUnchanged(); !s.ok()) return s;
  }
  rec.finished_at = evidence::Rfc3339Now();
  return rec;
}

}  // namespace ckpt::audit
