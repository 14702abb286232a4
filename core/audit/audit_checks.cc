#include "core/audit/audit_checks.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/audit/layout_check.h"
#include "core/checkpoint.h"
#include "core/forward/forward_stream.h"
#include "core/evidence/environment.h"
#include "core/io/tree_stream.h"
#include "core/text/name_encoding.h"

namespace ckpt::audit {
namespace {

using evidence::CheckResult;
using evidence::Verdict;

evidence::Finding FindingOf(const quant::Finding& f) {
  evidence::Finding e;
  e.code = f.code;
  e.message = f.message;
  e.tensor = f.tensor;
  if (f.row >= 0) e.row = f.row;
  if (f.group >= 0) e.group = f.group;
  e.numbers = f.numbers;
  return e;
}

void AddFindings(const quant::FindingList& list, CheckResult* c) {
  for (const quant::Finding& f : list.kept()) c->findings.push_back(FindingOf(f));
}

evidence::ScaleWindowThresholds ThresholdsOf(const quant::ScaleWindowConfig& c) {
  return {c.name, c.version, c.max_span, c.marlin_span, c.marlin_min_scale_log2,
          static_cast<int64_t>(c.max_listed)};
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
  c.details.Set("manifest_algorithm", std::string(fp.manifest.Algorithm()));
  c.details.Set("manifest_root", fp.manifest.RootHex());
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
    evidence::Series s{"Scale exponent span per layer", "k_max - k_min (powers of two)",
                       r.config.max_span, r.config.marlin_span, {}};
    for (const std::string& l : order) s.points.push_back({l, span_by_layer[l]});
    c.series.push_back(std::move(s));
  }
  c.details.Set("verdict", quant::VerdictName(r.verdict));
  c.details.Set("policy", ThresholdsOf(r.config));
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
  if (!r.mismatches.by_code().empty()) {
    evidence::Series s{"Pair mismatches by kind", "count", std::nullopt, std::nullopt, {}};
    for (const auto& [code, n] : r.mismatches.by_code()) {
      s.points.push_back({code, static_cast<int64_t>(n)});
    }
    c.series.push_back(std::move(s));
  }
  c.details.Set("derived_kind", r.derived_kind);
  c.details.Set("verdict", r.verdict());
  return c;
}

CheckResult ForwardCheck(const forward::ForwardAuditResult& r) {
  CheckResult c;
  c.name = "block_forward";
  c.verdict = r.passed ? Verdict::kPass : Verdict::kFail;
  const evidence::BlockForward& rep = r.report;
  c.counts["layers_run"] = static_cast<int64_t>(rep.layers.size());
  c.counts["layers_passed"] = rep.layers_passed;
  evidence::Series differing{"Block output elements differing from the source, per layer",
                             "elements", std::nullopt, std::nullopt, {}};
  evidence::Series emulated{"Output elements differing after vLLM's w1/w3 scale collapse",
                            "elements", std::nullopt, std::nullopt, {}};
  for (const evidence::ForwardLayer& layer : rep.layers) {
    const std::string label = absl::StrCat("layer ", layer.layer);
    const evidence::ForwardTensorDiff* out =
        layer.source_vs_derived ? layer.source_vs_derived->Find("output") : nullptr;
    if (out != nullptr) {
      const int64_t n = static_cast<int64_t>(out->differing);
      differing.points.push_back({label, n});
      if (n > 0) {
        evidence::Finding f;
        f.code = "block-output-differs";
        f.layer = layer.layer;
        f.message = absl::StrCat(label, ": ", n, " of ", out->elements,
                                 " output elements differ, max |diff| ", out->max_abs_diff);
        c.findings.push_back(std::move(f));
      }
    }
    const evidence::ForwardTensorDiff* emulated_out =
        layer.backend_emulation ? layer.backend_emulation->vs_reference.Find("output") : nullptr;
    if (emulated_out != nullptr) {
      const int64_t n = static_cast<int64_t>(emulated_out->differing);
      emulated.points.push_back({label, n});
      if (n > 0) {
        // The measured size of the scale window's vllm-w13-global-scale-collapse hazard.
        evidence::Finding f;
        f.code = "vllm-w13-collapse-output-differs";
        f.hazard = "vllm-w13-global-scale-collapse";
        f.layer = layer.layer;
        f.message = absl::StrCat(label, ": loaded as vLLM does (w1's global scale for w3), ", n,
                                 " output elements differ from the source, max |diff| ",
                                 emulated_out->max_abs_diff);
        c.findings.push_back(std::move(f));
      }
    }
  }
  c.findings_total = c.findings.size();
  if (!differing.points.empty()) c.series.push_back(std::move(differing));
  if (!emulated.points.empty()) c.series.push_back(std::move(emulated));
  c.details.Set("verdict", rep.verdict);
  c.details.Set("device", rep.device);
  c.details.Set("layers", rep.layer_spec);
  return c;
}

evidence::PairAudit PairAuditOf(const quant::PairVerifyResult& r) {
  evidence::PairAudit a;
  a.verdict = r.verdict();
  a.source_format = r.source_format;
  a.derived_format = r.derived_format;
  a.derived_kind = r.derived_kind;
  a.quantized_tensors = r.quantized_tensors;
  a.packed_bytes_compared = r.packed_bytes_compared;
  a.value_blocks_compared = r.value_blocks_compared;
  a.ignored_tensors_compared = r.ignored_tensors_compared;
  a.ignored_bytes_compared = r.ignored_bytes_compared;
  a.fused_groups_checked = r.fused_groups_checked;
  a.zero_groups_canonicalized = r.zero_groups_canonicalized;
  a.mismatches.total = r.mismatches.total();
  a.mismatches.by_code = r.mismatches.by_code();
  a.mismatches.cap = r.mismatches.cap();
  for (const quant::Finding& f : r.mismatches.kept()) a.mismatches.listed.push_back(FindingOf(f));
  return a;
}

evidence::PolicyRef PolicyRefOf(const quant::ScaleWindowConfig& policy) {
  return evidence::ScaleWindowPolicyRef(ThresholdsOf(policy));
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

// The first half of a tree's one read: listing (by its layout, docs/hf-layouts.md), small
// files and safetensors headers; the tensor data is left for StreamTrees.
struct TreeHeaders {
  std::shared_ptr<const TreeImage> image;
  TreeWalkOptions walk;  // the ignore_paths its fingerprint records
  LayoutInfo layout;
  std::shared_ptr<io::LinkResolver> resolver;  // what the listing's links resolved through
};

absl::StatusOr<TreeHeaders> ReadHeaders(const std::string& path,
                                        std::shared_ptr<const io::Directory> dir,
                                        const LinkOptions& links, const ReadOptions& read,
                                        Progress& progress) {
  if (dir == nullptr) {
    absl::StatusOr<std::unique_ptr<io::Directory>> opened = io::RealFileSystem().OpenRoot(path);
    if (!opened.ok()) return opened.status();
    dir = *std::move(opened);
  }
  absl::StatusOr<LayoutListing> listing = ListLayout(std::move(dir), links);
  if (!listing.ok()) return listing.status();
  auto image = ReadTree(std::move(listing->listing), read, progress);
  if (!image.ok()) return image.status();
  return TreeHeaders{*std::move(image), std::move(listing->walk), std::move(listing->layout),
                     std::move(listing->resolver)};
}

// A Hugging Face layout's own check (on the digests of the whole read), and its repo and
// commit as the model (source) ref unless the caller gave one (docs/hf-layouts.md).
void AddLayoutCheck(const char* name, const LayoutInfo& layout, const TreeImage& image,
                    std::string* ref, evidence::EvidenceRecord* rec) {
  if (layout.kind != TreeLayout::kPlain) rec->checks.push_back(LayoutCheck(name, layout, image));
  if (ref->empty()) *ref = layout.ModelRef();
}

// A checkpoint the strict reader refused, as a finding: the message names the file, the
// tensor and the offset.
evidence::Finding Unreadable(const char* code, const absl::Status& s) {
  evidence::Finding f;
  f.code = code;
  f.status = absl::StatusCodeToString(s.code());
  f.message = std::string(s.message());
  return f;
}

// Work for the stream, keyed by name: the stream admits work in file order and this order
// breaks its ties (work on the same module of both trees sorts together).
struct KeyedWork {
  std::string key;
  StreamWork work;
};

void Need(const Checkpoint& ckpt, const std::vector<std::string>& names, StreamWork* w) {
  for (const std::string& n : names) {
    if (std::optional<TensorRef> t = ckpt.Find(n)) w->tensors.push_back({t->file, t->info});
  }
}

// The block forward's options: the requested layers on the caller's device. Audits always
// measure the vLLM w1/w3 global-scale collapse (docs/forward.md; free when no NVFP4 expert's w1
// and w3 global scales differ), unless another emulation is asked for.
forward::ForwardAuditOptions ForwardOptionsOf(const AuditOptions& options) {
  forward::ForwardAuditOptions fopt;
  fopt.precision = options.forward_device.name == "cpu" ? forward::Precision::kF64
                                                        : forward::Precision::kBF16;
  fopt.emulation = options.forward_emulation == forward::Emulation::kNone
                       ? forward::Emulation::kVllmW13Collapse
                       : options.forward_emulation;
  return fopt;
}

}  // namespace

absl::StatusOr<evidence::EvidenceRecord> RunAudit(const AuditOptions& options,
                                                  Progress& progress, AuditStats* stats) {
  auto policy = PolicyByName(options.policy);
  if (!policy.ok()) return policy.status();
  evidence::EvidenceRecord rec;
  rec.started_at = evidence::Rfc3339Now();
  rec.environment = evidence::CollectEnvironment();
  rec.policy = PolicyRefOf(*policy);
  rec.refs = options.refs;
  rec.invoker = options.invoker;

  ReadOptions read;
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.threads = options.threads;
  read.memory_window = options.memory_window;
  read.tensor_digests = false;  // the record names files and the manifest ROOT, not tensors
  const bool pair = !options.source.empty() || options.source_dir != nullptr;
  auto derived_headers = ReadHeaders(options.root, options.root_dir, options.links, read, progress);
  if (!derived_headers.ok()) return derived_headers.status();
  const std::shared_ptr<const TreeImage> derived_image = derived_headers->image;
  std::optional<TreeHeaders> source_headers;
  std::shared_ptr<const TreeImage> source_image;
  if (pair) {
    auto s = ReadHeaders(options.source, options.source_dir, options.links, read, progress);
    if (!s.ok()) return s.status();
    source_headers = *std::move(s);
    source_image = source_headers->image;
  }

  // Everything a check decides is planned from headers, then run by the stream as the tensors
  // it reads arrive (docs/audit-engine.md).
  CheckResult structure;
  structure.name = "checkpoint_structure";
  auto ckpt = Checkpoint::Open(derived_image);
  if (!ckpt.ok()) {
    structure.verdict = evidence::Verdict::kFail;
    structure.findings.push_back(Unreadable("unreadable-checkpoint", ckpt.status()));
  } else {
    structure.counts["shards"] = static_cast<int64_t>((*ckpt)->shards().size());
    structure.counts["tensors"] = static_cast<int64_t>((*ckpt)->TensorNames().size());
    structure.counts["tensor_bytes"] = static_cast<int64_t>((*ckpt)->total_tensor_bytes());
    structure.details.Set("layout", std::string(LayoutName((*ckpt)->layout())));
  }
  std::unique_ptr<Checkpoint> source_ckpt;
  std::optional<CheckResult> unreadable_source;
  if (pair) {
    auto opened = Checkpoint::Open(source_image);
    if (!opened.ok()) {
      CheckResult c;
      c.name = "pair_verify";
      c.verdict = evidence::Verdict::kFail;
      c.findings.push_back(Unreadable("unreadable-source", opened.status()));
      unreadable_source = std::move(c);
    } else {
      source_ckpt = *std::move(opened);
    }
  }

  std::vector<KeyedWork> keyed;
  const quant::ScaleWindowPolicy window_policy(*policy);
  std::vector<quant::ScaleWindowUnit> window_units;
  std::vector<quant::ScaleWindowPartial> window_parts;
  std::optional<quant::PairPlan> pair_plan;
  std::vector<quant::PairUnitOutcome> pair_outcomes;
  quant::PairVerifyOptions popt;
  popt.threads = options.threads;
  popt.format.root_map = options.root_map;
  const forward::ForwardAuditOptions forward_options = ForwardOptionsOf(options);
  std::unique_ptr<forward::StreamedForward> forward_plan;
  if (ckpt.ok()) {
    const Checkpoint& d = **ckpt;
    auto units = window_policy.Plan(d);
    if (!units.ok()) return units.status();
    window_units = *std::move(units);
    window_parts.resize(window_units.size());
    for (size_t i = 0; i < window_units.size(); ++i) {
      KeyedWork k{window_units[i].members.front().name,
                  {absl::StrCat("scale_window ", window_units[i].fused_group), {}, {}}};
      Need(d, window_units[i].tensors, &k.work);
      k.work.run = [&, i]() -> absl::Status {
        auto part = window_policy.Scan(d, window_units[i]);
        if (!part.ok()) return part.status();
        window_parts[i] = *std::move(part);
        return absl::OkStatus();
      };
      keyed.push_back(std::move(k));
    }
  }
  if (ckpt.ok() && source_ckpt != nullptr) {
    const Checkpoint& d = **ckpt;
    const Checkpoint& s = *source_ckpt;
    auto plan = quant::PlanPair(s, d, popt);
    if (!plan.ok()) return plan.status();
    pair_plan = *std::move(plan);
    pair_outcomes.resize(pair_plan->units.size());
    for (size_t i = 0; i < pair_plan->units.size(); ++i) {
      const quant::PairUnit& u = pair_plan->units[i];
      KeyedWork k{u.name, {absl::StrCat("pair_verify ", u.name), {}, {}}};
      Need(s, u.source_tensors, &k.work);
      Need(d, u.derived_tensors, &k.work);
      k.work.run = [&, i]() -> absl::Status {
        auto o = quant::CompareUnit(s, d, pair_plan->units[i], popt);
        if (!o.ok()) return o.status();
        pair_outcomes[i] = *std::move(o);
        return absl::OkStatus();
      };
      keyed.push_back(std::move(k));
    }
  }
  std::sort(keyed.begin(), keyed.end(),
            [](const KeyedWork& a, const KeyedWork& b) { return a.key < b.key; });
  std::vector<StreamWork> work;
  for (KeyedWork& k : keyed) work.push_back(std::move(k.work));
  if (ckpt.ok() && !options.forward_layers.empty()) {
    // After the sorted work (last among ties): the block forward's units (core/forward/
    // forward_stream.h), which hold only the experts the tokens route to.
    auto layers = forward::ResolveLayers(options.forward_layers, (*ckpt)->text_config());
    if (!layers.ok()) return layers.status();
    auto plan = forward::StreamedForward::Plan(**ckpt, source_ckpt.get(), *std::move(layers),
                                               forward_options, options.forward_device);
    if (!plan.ok()) return plan.status();
    forward_plan = *std::move(plan);
    for (StreamWork& w : forward_plan->Work(work.size())) work.push_back(std::move(w));
  }
  std::vector<std::shared_ptr<const TreeImage>> images = {derived_image};
  if (source_image) images.push_back(source_image);
  auto streamed = StreamTrees(images, std::move(work), read, progress);
  if (!streamed.ok()) return streamed.status();
  if (stats != nullptr) stats->peak_kept_bytes = streamed->peak_kept_bytes;

  const TreeImage& derived_read = *streamed->images[0];
  const Fingerprint derived_fp =
      FingerprintOf(derived_read, derived_headers->walk.ignore_paths);
  rec.root = derived_read.root;
  rec.subjects = SubjectsOf(derived_fp);
  rec.checks.push_back(FingerprintCheck(derived_fp));
  uint64_t bytes_read = derived_read.bytes_read;
  if (pair) {
    const TreeImage& source_read = *streamed->images[1];
    const Fingerprint source_fp =
        FingerprintOf(source_read, source_headers->walk.ignore_paths);
    bytes_read += source_read.bytes_read;
    std::vector<evidence::Subject> files = SubjectsOf(source_fp);
    files.pop_back();  // the manifest ROOT has its own field
    rec.source = evidence::SourceBinding{source_read.root, source_fp.manifest.RootHex(),
                                         std::move(files)};
  }
  // Storage bytes read by the whole audit (both trees): each byte once.
  rec.checks.front().counts["bytes_read"] = static_cast<int64_t>(bytes_read);
  if (stats != nullptr) stats->bytes_read = bytes_read;
  AddLayoutCheck("hf_layout", derived_headers->layout, derived_read, &rec.refs.model_ref, &rec);
  if (pair) {
    AddLayoutCheck("source_hf_layout", source_headers->layout, *streamed->images[1],
                   &rec.refs.source_ref, &rec);
  }
  rec.checks.push_back(structure);
  if (ckpt.ok()) {
    rec.checks.push_back(ScaleWindowCheck(window_policy.Finish(std::move(window_parts))));
  }
  if (unreadable_source) rec.checks.push_back(*unreadable_source);
  if (pair_plan) {
    quant::PairVerifyResult r = quant::FinishPair(*std::move(pair_plan), pair_outcomes);
    rec.checks.push_back(PairCheck(r));
    if (!options.root_map.empty()) {  // what the X4T checkpoint_root was compared with
      std::vector<std::string> maps;
      for (const quant::RootMapping& m : options.root_map) {
        maps.push_back(EncodeName(m.declared) + "=" + EncodeName(m.actual));
      }
      rec.checks.back().details.Set("root_map", std::move(maps));
    }
    rec.pair_audit = PairAuditOf(r);
  }
  if (forward_plan) {
    auto forward_result = forward_plan->Finish(options.forward_layers);
    if (!forward_result.ok()) return forward_result.status();
    rec.checks.push_back(ForwardCheck(*forward_result));
    rec.block_forward = forward_result->report;
    if (const auto& g = options.forward_device.gpu) {
      rec.environment.gpu = evidence::GpuInfo{g->name, g->sm, g->driver, g->cuda};
    }
  }
  // Every verdict above was computed from the bytes read; the names must still lead to them.
  for (const auto& image : streamed->images) {
    if (auto s = image->CheckUnchanged(); !s.ok()) return s;
  }
  rec.finished_at = evidence::Rfc3339Now();
  return rec;
}

}  // namespace ckpt::audit
