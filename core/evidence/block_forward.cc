#include "core/evidence/block_forward.h"

namespace ckpt::evidence {
namespace {

using json = nlohmann::json;

constexpr const char* kBucketNames[kForwardUlpBuckets] = {"0",    "1",      "2-3",
                                                          "4-15", "16-255", "256+"};

json HistogramJson(const ForwardTensorDiff& d) {
  json hist = json::object();
  for (int i = 0; i < kForwardUlpBuckets; ++i) hist[kBucketNames[i]] = d.ulp_histogram[i];
  return hist;
}

json TensorDiffJson(const ForwardTensorDiff& d) {
  return {{"bitwise_equal", d.differing == 0},
          {"elements", d.elements},
          {"differing_elements", d.differing},
          {"max_abs_diff", d.max_abs_diff},
          {"ulp_histogram", HistogramJson(d)}};
}

json DiffJson(const ForwardDiff& d) {
  json tensors = json::object();
  for (const ForwardTensorDiff& t : d.tensors) tensors[t.name] = TensorDiffJson(t);
  return {{"bitwise_equal", d.bitwise_equal()}, {"tensors", tensors}};
}

json RunJson(const ForwardRun& r) {
  json digests = json::object();
  for (const auto& [name, hex] : r.tensor_sha256) digests[name] = hex;
  return {{"root", r.root}, {"output_sha256", r.OutputSha256()}, {"tensor_sha256", digests}};
}

uint64_t OutputDiffering(const ForwardDiff& d) {
  const ForwardTensorDiff* out = d.Find("output");
  return out == nullptr ? 0 : out->differing;
}

json LayerJson(const ForwardLayer& l) {
  json j = {{"layer", l.layer},
            {"family", l.family},
            {"derived", RunJson(l.derived)},
            {"determinism", {{"reruns", 1},
                             {"bitwise_equal", l.determinism.bitwise_equal()},
                             {"differing_elements", OutputDiffering(l.determinism)}}},
            {"verdict", l.verdict}};
  if (l.source) j["source"] = RunJson(*l.source);
  if (l.source_vs_derived) j["source_vs_derived"] = DiffJson(*l.source_vs_derived);
  if (const auto& d = l.device_vs_cpu) {
    json rel = json::object();
    for (const auto& [name, v] : d->max_relative_error) rel[name] = v;
    j["device_vs_cpu"] = {{"cpu_precision", d->cpu_precision},
                          {"topk_ids_equal", d->topk_ids_equal},
                          {"max_relative_error", rel},
                          {"relative_error_definition", "max|device - cpu| / max|cpu|"}};
  }
  if (const auto& e = l.backend_emulation) {
    j["backend_emulation"] = {{"name", e->name},
                              {"experts_changed", e->experts_changed},
                              {"compared_against", e->compared_against},
                              {"output_sha256", e->output_sha256},
                              {"vs_reference", DiffJson(e->vs_reference)},
                              {"verdict", e->verdict}};
  }
  return j;
}

// A layer's row of the multi-layer summary: its output against the source and, emulated,
// against the reference.
json SummaryRow(const ForwardLayer& l) {
  json row = {{"layer", l.layer},
              {"verdict", l.verdict},
              {"derived_output_sha256", l.derived.OutputSha256()}};
  if (l.source && l.source_vs_derived) {
    row["source_output_sha256"] = l.source->OutputSha256();
    if (const ForwardTensorDiff* out = l.source_vs_derived->Find("output")) {
      row["output_differing_elements"] = out->differing;
      row["output_elements"] = out->elements;
      row["output_max_abs_diff"] = out->max_abs_diff;
      row["output_ulp_histogram"] = HistogramJson(*out);
    }
  }
  if (l.device_vs_cpu) {
    for (const auto& [name, v] : l.device_vs_cpu->max_relative_error) {
      if (name == "output") row["device_vs_cpu_output"] = v;
    }
  }
  if (const auto& e = l.backend_emulation) {
    row["emulated_verdict"] = e->verdict;
    row["emulated_experts_changed"] = e->experts_changed;
    if (const ForwardTensorDiff* out = e->vs_reference.Find("output")) {
      row["emulated_output_differing_elements"] = out->differing;
      row["emulated_output_max_abs_diff"] = out->max_abs_diff;
      row["emulated_output_ulp_histogram"] = HistogramJson(*out);
    }
  }
  return row;
}

// The fields every report shares.
void Header(const BlockForward& f, json& j) {
  j["device"] = f.device;
  j["device_description"] = f.device_description;
  if (const auto& g = f.device_properties) {
    j["device_properties"] = {{"name", g->name}, {"sm", g->sm}, {"driver", g->driver},
                              {"cuda", g->cuda}};
  }
  j["precision"] = f.precision;
  json input = {{"origin", f.input.origin}, {"tokens", f.input.tokens},
                {"sha256", f.input.sha256}};
  if (f.input.origin == "file") input["path"] = f.input.path;
  else input["seed"] = std::to_string(f.input.seed);
  j["input"] = std::move(input);
  if (!f.emulation.empty()) j["emulation"] = f.emulation;
}

}  // namespace

bool ForwardDiff::bitwise_equal() const {
  for (const ForwardTensorDiff& t : tensors) {
    if (t.differing != 0) return false;
  }
  return true;
}

const ForwardTensorDiff* ForwardDiff::Find(const std::string& name) const {
  for (const ForwardTensorDiff& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string ForwardRun::OutputSha256() const {
  for (const auto& [name, hex] : tensor_sha256) {
    if (name == "output") return hex;
  }
  return "";
}

json BlockForward::ToJson() const {
  json j;
  if (!multi_layer()) {
    j = layers.empty() ? json::object() : LayerJson(layers.front());
    j["schema"] = "ckpt-audit.forward/1";
    Header(*this, j);
    if (!output_file.empty()) j["output_file"] = output_file;
    return j;
  }
  json per_layer = json::array(), summary = json::array();
  for (const ForwardLayer& l : layers) {
    per_layer.push_back(LayerJson(l));
    summary.push_back(SummaryRow(l));
  }
  j = {{"schema", "ckpt-audit.model-forward/1"},
       {"family", family},
       {"layers_requested", layer_spec},
       {"layers", std::move(per_layer)},
       {"summary", std::move(summary)},
       {"layers_run", layers.size()},
       {"layers_passed", layers_passed},
       {"verdict", verdict}};
  Header(*this, j);
  return j;
}

}  // namespace ckpt::evidence
