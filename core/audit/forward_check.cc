#include "core/audit/forward_check.h"

#include "absl/strings/str_cat.h"

namespace ckpt::audit {

absl::Status ForwardCheck::Plan(const Checkpoints& trees, WorkPlan& plan) {
  if (trees.root == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<int>> layers = std::vector<int>{options_.layer};
  if (!layers_.empty()) layers = forward::ResolveLayers(layers_, trees.root->text_config());
  if (!layers.ok()) {
    return absl::Status(layers.status().code(),
                        absl::StrCat(trees.root->root(), ": ", layers.status().message()));
  }
  auto planned = forward::StreamedForward::Plan(*trees.root, trees.source, *std::move(layers),
                                                options_, device_);
  if (!planned.ok()) return planned.status();
  forward_ = *std::move(planned);
  // Last among ties; the units' `after` count from the first of them.
  for (StreamWork& w : forward_->Work(plan.last_count())) plan.AddLast(std::move(w));
  return absl::OkStatus();
}

absl::StatusOr<forward::ForwardAuditResult> ForwardCheck::Result() && {
  return forward_->Finish(layers_);
}

evidence::CheckResult RecordOf(const forward::ForwardAuditResult& r) {
  evidence::CheckResult c;
  c.name = "block_forward";
  c.verdict = r.passed ? evidence::Verdict::kPass : evidence::Verdict::kFail;
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
      // The measured size of the scale window's vllm-w13-global-scale-collapse hazard: only
      // where the emulation changed an expert. Where it changed none, the emulated output is
      // the derived one, and a difference from the source is block-output-differs' alone.
      if (n > 0 && layer.backend_emulation->experts_changed > 0) {
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

absl::StatusOr<forward::ForwardAuditResult> RunForward(const std::string& layers,
                                                       const forward::ForwardAuditOptions& o,
                                                       const forward::ForwardDevice& device,
                                                       forward::ForwardReadStats* stats) {
  if (!layers.empty() && !o.output_path.empty()) {
    return absl::InvalidArgumentError("--output writes one layer's tensors; use --layer");
  }
  EngineOptions options;
  options.root = o.root;
  options.source = o.source;
  options.threads = o.threads;
  options.memory_window = o.memory_window;
  options.file_digests = false;  // the forward's report names output digests, not files
  auto engine = Engine::Open(options, NoProgress());
  if (!engine.ok()) return engine.status();
  const Engine& e = **engine;
  if (e.root().checkpoint == nullptr) return e.root().checkpoint_status;
  if (e.has_source() && e.source().checkpoint == nullptr) return e.source().checkpoint_status;
  ForwardCheck check(layers, o, device);
  auto streamed = (*engine)->Run({&check}, NoProgress());
  if (!streamed.ok()) return streamed.status();
  if (absl::Status s = (*engine)->CheckUnchanged(*streamed); !s.ok()) return s;
  if (stats != nullptr) *stats = {streamed->bytes_read, streamed->peak_kept_bytes};
  return std::move(check).Result();
}

}  // namespace ckpt::audit
