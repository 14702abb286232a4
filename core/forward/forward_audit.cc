#include "core/forward/forward_audit.h"

#include <algorithm>
#include <bit>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/forward/block_io.h"
#include "core/forward/result_diff.h"
#include "core/sha256.h"

namespace ckpt::forward {
namespace {

// The expert spans in `weights` point into the checkpoint's bytes, which outlive the audit.
struct LoadedBlock {
  const Checkpoint* ckpt = nullptr;
  BlockConfig config;
  BlockWeights weights;
};

absl::StatusOr<LoadedBlock> Load(const Checkpoint& ckpt, int layer) {
  LoadedBlock b;
  b.ckpt = &ckpt;
  auto cfg = ParseBlockConfig(ckpt.text_config(), layer);
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(),
                        absl::StrCat(ckpt.root(), ": ", cfg.status().message()));
  }
  b.config = *cfg;
  auto w = LoadBlockWeights(ckpt, b.config, layer);
  if (!w.ok()) return w.status();
  b.weights = std::move(*w);
  return b;
}

bool SameShape(const BlockConfig& a, const BlockConfig& b) {
  return a.family == b.family && a.hidden == b.hidden && a.latent == b.latent &&
         a.expert_intermediate == b.expert_intermediate &&
         a.shared_intermediate == b.shared_intermediate && a.experts == b.experts &&
         a.top_k == b.top_k && a.n_group == b.n_group && a.topk_group == b.topk_group;
}

nlohmann::json Digests(const BlockResult& r, Precision p) {
  nlohmann::json d = nlohmann::json::object();
  for (const std::string& name : BlockTensorNames()) {
    std::vector<uint8_t> bytes = TensorBytes(r, name, p);
    d[name] = ToHex(Sha256Of(bytes));
  }
  return d;
}

nlohmann::json RunJson(const std::string& root, const BlockResult& r, Precision p) {
  nlohmann::json digests = Digests(r, p);
  return {{"root", root}, {"output_sha256", digests["output"]}, {"tensor_sha256", digests}};
}


// Where a layer's report goes: everything RunForwardAudit reports for one layer, except the
// fields every layer shares (schema, device, precision, input).
struct LayerOutcome {
  nlohmann::json report;
  bool passed = false;
  bool emulation_differs = false;
  BlockConfig config;
  BlockResult derived;
};

nlohmann::json DeviceVsCpu(const BlockResult& run, const BlockResult& cpu, Precision p) {
  nlohmann::json rel = nlohmann::json::object();
  for (const auto& [name, a, b] :
       {std::tuple{"router_logits", &run.router_logits, &cpu.router_logits},
        std::tuple{"topk_weights", &run.topk_weights, &cpu.topk_weights},
        std::tuple{"latent_in", &run.latent_in, &cpu.latent_in},
        std::tuple{"latent_out_normed", &run.latent_out_normed, &cpu.latent_out_normed},
        std::tuple{"routed_out", &run.routed_out, &cpu.routed_out},
        std::tuple{"shared_out", &run.shared_out, &cpu.shared_out},
        std::tuple{"output", &run.output, &cpu.output}}) {
    rel[name] = ExactDecimal(MaxRelativeError(*a, *b));
  }
  return {{"cpu_precision", PrecisionName(p)},
          {"topk_ids_equal", run.topk_ids == cpu.topk_ids},
          {"max_relative_error", rel},
          {"relative_error_definition", "max|device - cpu| / max|cpu|"}};
}

absl::StatusOr<LayerOutcome> RunLayer(const Checkpoint& derived_ckpt,
                                      const Checkpoint* source_ckpt, int layer,
                                      const BlockInput& input, const ForwardAuditOptions& o,
                                      const ForwardDevice& device) {
  auto derived = Load(derived_ckpt, layer);
  if (!derived.ok()) return derived.status();
  const BlockConfig& config = derived->config;
  if (static_cast<size_t>(config.hidden) * input.tokens != input.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        derived_ckpt.root(), ": layer ", layer, " has hidden size ", config.hidden,
        ", the input has ", input.values.size() / std::max<int64_t>(input.tokens, 1)));
  }
  auto run = device.run(config, derived->weights, input, o.precision);
  if (!run.ok()) return run.status();
  auto rerun = device.run(config, derived->weights, input, o.precision);
  if (!rerun.ok()) return rerun.status();
  const ResultDiff determinism = CompareResults(*run, *rerun, o.precision);

  LayerOutcome out;
  out.config = config;
  nlohmann::json& report = out.report;
  report = {
      {"layer", layer},
      {"family", FamilyName(config.family)},
      {"derived", RunJson(derived->ckpt->root(), *run, o.precision)},
      {"determinism", {{"reruns", 1}, {"bitwise_equal", determinism.bitwise_equal()},
                       {"differing_elements", determinism.Find("output")->differing}}},
  };
  bool passed = determinism.bitwise_equal();

  std::optional<BlockResult> src;
  if (source_ckpt != nullptr) {
    auto source = Load(*source_ckpt, layer);
    if (!source.ok()) return source.status();
    if (!SameShape(source->config, config)) {
      return absl::InvalidArgumentError(absl::StrCat(source_ckpt->root(), " and ",
                                                     derived_ckpt.root(), ": layer ", layer,
                                                     " blocks differ in shape or family"));
    }
    auto s = device.run(source->config, source->weights, input, o.precision);
    if (!s.ok()) return s.status();
    const ResultDiff diff = CompareResults(*s, *run, o.precision);
    report["source"] = RunJson(source->ckpt->root(), *s, o.precision);
    report["source_vs_derived"] = ToJson(diff);
    passed = passed && diff.bitwise_equal();
    src = *std::move(s);
  }

  if (device.name != "cpu") {
    auto cpu = RunBlockCpu(config, derived->weights, input, o.precision);
    if (!cpu.ok()) return cpu.status();
    report["device_vs_cpu"] = DeviceVsCpu(*run, *cpu, o.precision);
  }

  if (o.emulation != Emulation::kNone) {
    // The stored weights are not needed any more: emulate in place.
    const int changed = ApplyEmulation(o.emulation, derived->weights);
    // Unchanged weights give the stored run's bits (the re-run above showed it deterministic).
    absl::StatusOr<BlockResult> emulated =
        changed == 0 ? absl::StatusOr<BlockResult>(*run)
                     : device.run(config, derived->weights, input, o.precision);
    if (!emulated.ok()) return emulated.status();
    const BlockResult& reference = src ? *src : *run;
    const ResultDiff diff = CompareResults(reference, *emulated, o.precision);
    out.emulation_differs = !diff.bitwise_equal();
    report["backend_emulation"] = {
        {"name", EmulationName(o.emulation)},
        {"experts_changed", changed},
        {"compared_against", src ? "source" : "derived"},
        {"output_sha256", ToHex(Sha256Of(TensorBytes(*emulated, "output", o.precision)))},
        {"vs_reference", ToJson(diff)},
        {"verdict", diff.bitwise_equal() ? "bit-identical" : "different"}};
  }

  report["verdict"] = source_ckpt == nullptr ? (passed ? "deterministic" : "nondeterministic")
                      : passed               ? "bit-identical"
                                             : "different";
  out.passed = passed;
  out.derived = *std::move(run);
  return out;
}

absl::StatusOr<std::pair<BlockInput, nlohmann::json>> MakeInput(const ForwardAuditOptions& o,
                                                                int hidden) {
  BlockInput input;
  nlohmann::json input_json;
  if (!o.input_path.empty()) {
    auto in = ReadBlockInput(o.input_path, hidden);
    if (!in.ok()) return in.status();
    input = std::move(*in);
    input_json = {{"origin", "file"}, {"path", o.input_path}};
  } else {
    if (o.tokens <= 0 || o.tokens > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens must be in [1, 2^20], got ",
                                                     o.tokens));
    }
    input = SeededInput(o.tokens, hidden, o.seed);
    input_json = {{"origin", "seed"}, {"seed", std::to_string(o.seed)}};
  }
  input_json["tokens"] = input.tokens;
  input_json["sha256"] = ToHex(Sha256Of(InputBytes(input)));
  return std::pair{std::move(input), std::move(input_json)};
}

// The fields every report shares.
void Header(nlohmann::json& report, const ForwardDevice& device, const ForwardAuditOptions& o,
            const nlohmann::json& input_json) {
  report["device"] = device.name;
  report["device_description"] = device.description;
  if (device.gpu) {
    report["device_properties"] = {{"name", device.gpu->name},
                                   {"sm", device.gpu->sm},
                                   {"driver", device.gpu->driver},
                                   {"cuda", device.gpu->cuda}};
  }
  report["precision"] = PrecisionName(o.precision);
  report["input"] = input_json;
  if (o.emulation != Emulation::kNone) report["emulation"] = EmulationName(o.emulation);
}

int IntOr(const nlohmann::json& c, const char* key, int fallback) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer()) return fallback;
  const long long v = it->get<long long>();
  return v < 0 || v > (1 << 20) ? fallback : static_cast<int>(v);
}

// The derived checkpoint at `o.root` and, when `o.source` is set, the source.
struct OpenedPair {
  std::unique_ptr<Checkpoint> derived, source;
};

absl::StatusOr<OpenedPair> OpenPair(const ForwardAuditOptions& o) {
  OpenedPair pair;
  auto derived = Checkpoint::Open(o.root);
  if (!derived.ok()) return derived.status();
  pair.derived = *std::move(derived);
  if (!o.source.empty()) {
    auto source = Checkpoint::Open(o.source);
    if (!source.ok()) return source.status();
    pair.source = *std::move(source);
  }
  return pair;
}

}  // namespace

std::string EmulationName(Emulation e) {
  return e == Emulation::kVllmW13Collapse ? "vllm-w13-collapse" : "none";
}

absl::StatusOr<Emulation> ParseEmulation(const std::string& s) {
  if (s.empty() || s == "none") return Emulation::kNone;
  if (s == "vllm-w13-collapse") return Emulation::kVllmW13Collapse;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --emulate '", s, "' (none|vllm-w13-collapse)"));
}

int ApplyEmulation(Emulation e, BlockWeights& w) {
  if (e != Emulation::kVllmW13Collapse) return 0;
  int changed = 0;
  for (ExpertWeights& ex : w.experts) {
    if (ex.gate.scale_kind != Fp4Scale::kE4M3Group16 ||
        ex.up.scale_kind != Fp4Scale::kE4M3Group16) {
      continue;
    }
    // Compared as bits: a NaN or signed-zero global scale counts as differing too.
    if (std::bit_cast<uint32_t>(ex.gate.global_scale) !=
        std::bit_cast<uint32_t>(ex.up.global_scale)) {
      ex.up.global_scale = ex.gate.global_scale;
      ++changed;
    }
  }
  return changed;
}

absl::StatusOr<std::vector<int>> ResolveLayers(const std::string& spec,
                                               const nlohmann::json& c) {
  const int layers = IntOr(c, "num_hidden_layers", 0);
  std::vector<int> out;
  if (spec == "all") {
    if (layers <= 0) {
      return absl::InvalidArgumentError(
          "--layers all: config.json has no valid integer 'num_hidden_layers'");
    }
    const int dense = c.value("model_type", "") == "gpt_oss"
                          ? 0 : IntOr(c, "first_k_dense_replace", 0);
    for (int l = dense; l < layers; ++l) out.push_back(l);
  } else {
    std::set<int> seen;
    for (absl::string_view item : absl::StrSplit(spec, ',')) {
      int l = -1;
      if (!absl::SimpleAtoi(item, &l) || l < 0 || (layers > 0 && l >= layers) || l > (1 << 20)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--layers: '", item, "' is not a layer index", layers > 0 ? " in [0, " : "",
            layers > 0 ? absl::StrCat(layers, ")") : "", " (expected all or L1,L2,...)"));
      }
      if (!seen.insert(l).second) {
        return absl::InvalidArgumentError(absl::StrCat("--layers: layer ", l, " named twice"));
      }
      out.push_back(l);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--layers names no MoE layer");
  for (int l : out) {
    if (auto cfg = ParseBlockConfig(c, l); !cfg.ok()) return cfg.status();
  }
  return out;
}

ForwardDevice CpuDevice() {
  return {"cpu", "CPU reference (core/forward)", RunBlockCpu, std::nullopt};
}

absl::StatusOr<ForwardAuditResult> RunForwardAudit(const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto pair = OpenPair(o);
  if (!pair.ok()) return pair.status();
  return RunForwardAudit(*pair->derived, pair->source.get(), o, device);
}

absl::StatusOr<ForwardAuditResult> RunForwardAudit(const Checkpoint& derived_ckpt,
                                                   const Checkpoint* source_ckpt,
                                                   const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto cfg = ParseBlockConfig(derived_ckpt.text_config(), o.layer);
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(),
                        absl::StrCat(derived_ckpt.root(), ": ", cfg.status().message()));
  }
  auto input = MakeInput(o, cfg->hidden);
  if (!input.ok()) return input.status();
  auto layer = RunLayer(derived_ckpt, source_ckpt, o.layer, input->first, o, device);
  if (!layer.ok()) return layer.status();
  nlohmann::json report = std::move(layer->report);
  report["schema"] = "ckpt-audit.forward/1";
  Header(report, device, o, input->second);
  if (!o.output_path.empty()) {
    absl::Status s = WriteBlockResult(o.output_path, layer->config, input->first, layer->derived,
                                      o.precision,
                                      {{"root", derived_ckpt.root()},
                                       {"layer", std::to_string(o.layer)},
                                       {"device", device.name},
                                       {"precision", PrecisionName(o.precision)}});
    if (!s.ok()) return s;
    report["output_file"] = o.output_path;
  }
  return ForwardAuditResult{std::move(report), layer->passed, layer->emulation_differs};
}

absl::StatusOr<ForwardAuditResult> RunModelForward(const std::string& layers,
                                                   const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto pair = OpenPair(o);
  if (!pair.ok()) return pair.status();
  return RunModelForward(*pair->derived, pair->source.get(), layers, o, device);
}

absl::StatusOr<ForwardAuditResult> RunModelForward(const Checkpoint& derived_ckpt,
                                                   const Checkpoint* source_ckpt,
                                                   const std::string& spec,
                                                   const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto layers = ResolveLayers(spec, derived_ckpt.text_config());
  if (!layers.ok()) {
    return absl::Status(layers.status().code(),
                        absl::StrCat(derived_ckpt.root(), ": ", layers.status().message()));
  }
  if (!o.output_path.empty()) {
    return absl::InvalidArgumentError("--output writes one layer's tensors; use --layer");
  }
  auto cfg = ParseBlockConfig(derived_ckpt.text_config(), layers->front());
  if (!cfg.ok()) return cfg.status();
  auto input = MakeInput(o, cfg->hidden);
  if (!input.ok()) return input.status();

  nlohmann::json per_layer = nlohmann::json::array();
  nlohmann::json summary = nlohmann::json::array();
  bool passed = true, emulation_differs = false;
  int identical = 0;
  for (int l : *layers) {
    auto layer = RunLayer(derived_ckpt, source_ckpt, l, input->first, o, device);
    if (!layer.ok()) return layer.status();
    const nlohmann::json& r = layer->report;
    nlohmann::json row = {{"layer", l},
                          {"verdict", r["verdict"]},
                          {"derived_output_sha256", r["derived"]["output_sha256"]}};
    if (r.contains("source")) {
      const nlohmann::json& out = r["source_vs_derived"]["tensors"]["output"];
      row["source_output_sha256"] = r["source"]["output_sha256"];
      row["output_differing_elements"] = out["differing_elements"];
      row["output_elements"] = out["elements"];
      row["output_max_abs_diff"] = out["max_abs_diff"];
      row["output_ulp_histogram"] = out["ulp_histogram"];
    }
    if (r.contains("device_vs_cpu")) {
      row["device_vs_cpu_output"] = r["device_vs_cpu"]["max_relative_error"]["output"];
    }
    if (r.contains("backend_emulation")) {
      const nlohmann::json& e = r["backend_emulation"];
      const nlohmann::json& out = e["vs_reference"]["tensors"]["output"];
      row["emulated_verdict"] = e["verdict"];
      row["emulated_experts_changed"] = e["experts_changed"];
      row["emulated_output_differing_elements"] = out["differing_elements"];
      row["emulated_output_max_abs_diff"] = out["max_abs_diff"];
      row["emulated_output_ulp_histogram"] = out["ulp_histogram"];
    }
    summary.push_back(std::move(row));
    per_layer.push_back(std::move(layer->report));
    passed = passed && layer->passed;
    emulation_differs = emulation_differs || layer->emulation_differs;
    identical += layer->passed;
  }
  nlohmann::json report = {{"schema", "ckpt-audit.model-forward/1"},
                           {"family", FamilyName(cfg->family)},
                           {"layers_requested", spec},
                           {"layers", per_layer},
                           {"summary", summary},
                           {"layers_run", layers->size()},
                           {"layers_passed", identical}};
  Header(report, device, o, input->second);
  report["verdict"] = source_ckpt == nullptr ? (passed ? "deterministic" : "nondeterministic")
                      : passed               ? "bit-identical"
                                             : "different";
  return ForwardAuditResult{std::move(report), passed, emulation_differs};
}

}  // namespace ckpt::forward
