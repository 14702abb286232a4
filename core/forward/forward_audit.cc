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

evidence::ForwardRun RunOf(const std::string& root, const BlockResult& r, Precision p) {
  evidence::ForwardRun run{root, {}};
  for (const std::string& name : BlockTensorNames()) {
    run.tensor_sha256.emplace_back(name, ToHex(Sha256Of(TensorBytes(r, name, p))));
  }
  return run;
}

evidence::ForwardDiff DiffOf(const ResultDiff& d) {
  evidence::ForwardDiff out;
  for (const TensorDiff& t : d.tensors) {
    evidence::ForwardTensorDiff e{t.name, t.elements, t.differing, ExactDecimal(t.max_abs_diff),
                                  {}};
    static_assert(evidence::kForwardUlpBuckets == kUlpBuckets);
    for (int i = 0; i < kUlpBuckets; ++i) e.ulp_histogram[i] = t.ulp_histogram[i];
    out.tensors.push_back(std::move(e));
  }
  return out;
}

std::string VerdictOf(bool compared_with_source, bool passed) {
  return compared_with_source ? (passed ? "bit-identical" : "different")
                              : (passed ? "deterministic" : "nondeterministic");
}

// Where a layer's report goes: everything RunForwardAudit reports for one layer, except the
// fields every layer shares (schema, device, precision, input).
struct LayerOutcome {
  evidence::ForwardLayer report;
  bool passed = false;
  bool emulation_differs = false;
  BlockConfig config;
  BlockResult derived;
};

evidence::ForwardDeviceVsCpu DeviceVsCpu(const BlockResult& run, const BlockResult& cpu,
                                         Precision p) {
  evidence::ForwardDeviceVsCpu d{PrecisionName(p), run.topk_ids == cpu.topk_ids, {}};
  for (const auto& [name, a, b] :
       {std::tuple{"router_logits", &run.router_logits, &cpu.router_logits},
        std::tuple{"topk_weights", &run.topk_weights, &cpu.topk_weights},
        std::tuple{"latent_in", &run.latent_in, &cpu.latent_in},
        std::tuple{"latent_out_normed", &run.latent_out_normed, &cpu.latent_out_normed},
        std::tuple{"routed_out", &run.routed_out, &cpu.routed_out},
        std::tuple{"shared_out", &run.shared_out, &cpu.shared_out},
        std::tuple{"output", &run.output, &cpu.output}}) {
    d.max_relative_error.emplace_back(name, ExactDecimal(MaxRelativeError(*a, *b)));
  }
  return d;
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
  evidence::ForwardLayer& report = out.report;
  report.layer = layer;
  report.family = FamilyName(config.family);
  report.derived = RunOf(derived->ckpt->root(), *run, o.precision);
  report.determinism = DiffOf(determinism);
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
    report.source = RunOf(source->ckpt->root(), *s, o.precision);
    report.source_vs_derived = DiffOf(diff);
    passed = passed && diff.bitwise_equal();
    src = *std::move(s);
  }

  if (device.name != "cpu") {
    auto cpu = RunBlockCpu(config, derived->weights, input, o.precision);
    if (!cpu.ok()) return cpu.status();
    report.device_vs_cpu = DeviceVsCpu(*run, *cpu, o.precision);
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
    report.backend_emulation = evidence::ForwardEmulation{
        EmulationName(o.emulation),
        changed,
        src ? "source" : "derived",
        ToHex(Sha256Of(TensorBytes(*emulated, "output", o.precision))),
        DiffOf(diff),
        diff.bitwise_equal() ? "bit-identical" : "different"};
  }

  report.verdict = VerdictOf(source_ckpt != nullptr, passed);
  out.passed = passed;
  out.derived = *std::move(run);
  return out;
}

absl::StatusOr<std::pair<BlockInput, evidence::ForwardInput>> MakeInput(
    const ForwardAuditOptions& o, int hidden) {
  BlockInput input;
  evidence::ForwardInput input_ref;
  if (!o.input_path.empty()) {
    auto in = ReadBlockInput(o.input_path, hidden);
    if (!in.ok()) return in.status();
    input = std::move(*in);
    input_ref.origin = "file";
    input_ref.path = o.input_path;
  } else {
    if (o.tokens <= 0 || o.tokens > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens must be in [1, 2^20], got ",
                                                     o.tokens));
    }
    input = SeededInput(o.tokens, hidden, o.seed);
    input_ref.origin = "seed";
    input_ref.seed = o.seed;
  }
  input_ref.tokens = input.tokens;
  input_ref.sha256 = ToHex(Sha256Of(InputBytes(input)));
  return std::pair{std::move(input), std::move(input_ref)};
}

// The fields every report shares.
evidence::BlockForward Header(const ForwardDevice& device, const ForwardAuditOptions& o,
                              evidence::ForwardInput input) {
  evidence::BlockForward report;
  report.device = device.name;
  report.device_description = device.description;
  if (device.gpu) {
    report.device_properties =
        evidence::GpuInfo{device.gpu->name, device.gpu->sm, device.gpu->driver, device.gpu->cuda};
  }
  report.precision = PrecisionName(o.precision);
  report.input = std::move(input);
  if (o.emulation != Emulation::kNone) report.emulation = EmulationName(o.emulation);
  return report;
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
  evidence::BlockForward report = Header(device, o, std::move(input->second));
  report.family = layer->report.family;
  report.verdict = layer->report.verdict;
  report.layers_passed = layer->passed;
  report.layers.push_back(std::move(layer->report));
  if (!o.output_path.empty()) {
    absl::Status s = WriteBlockResult(o.output_path, layer->config, input->first, layer->derived,
                                      o.precision,
                                      {{"root", derived_ckpt.root()},
                                       {"layer", std::to_string(o.layer)},
                                       {"device", device.name},
                                       {"precision", PrecisionName(o.precision)}});
    if (!s.ok()) return s;
    report.output_file = o.output_path;
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

  evidence::BlockForward report = Header(device, o, std::move(input->second));
  report.family = FamilyName(cfg->family);
  report.layer_spec = spec;
  bool passed = true, emulation_differs = false;
  for (int l : *layers) {
    auto layer = RunLayer(derived_ckpt, source_ckpt, l, input->first, o, device);
    if (!layer.ok()) return layer.status();
    report.layers.push_back(std::move(layer->report));
    passed = passed && layer->passed;
    emulation_differs = emulation_differs || layer->emulation_differs;
    report.layers_passed += layer->passed;
  }
  report.verdict = VerdictOf(source_ckpt != nullptr, passed);
  return ForwardAuditResult{std::move(report), passed, emulation_differs};
}

}  // namespace ckpt::forward
