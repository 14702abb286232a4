#include "core/forward/forward_stream.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/forward/block_io.h"
#include "core/forward/result_diff.h"
#include "core/quant/quant_weight.h"
#include "core/sha256.h"

namespace ckpt::forward {
namespace {

// The runs of one layer: the derived weights on the device, its re-run (determinism), the
// source weights, the CPU reference of the derived weights (non-CPU devices), the derived
// weights as the emulated backend loads them.
enum RunKind { kDerived, kRerun, kSource, kCpu, kEmulated, kRunKinds };

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
    if (o.tokens <= 0 || o.tokens > kMaxTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens must be in [1, ", kMaxTokens, "], got ", o.tokens));
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

void AddTensors(const std::vector<TensorRef>& refs, StreamTensors* out) {
  for (const TensorRef& t : refs) out->push_back({t.file, t.info});
}

// Prefixes a load or run error with the checkpoint and layer it concerns.
absl::Status InLayer(const absl::Status& s, const Checkpoint& ckpt, int layer) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(ckpt.root(), ": layer ", layer, ": ", s.message()));
}

}  // namespace

struct StreamedForward::State {
  // One layer: its runs' results and expert rows, written by its units.
  struct Layer {
    int layer = 0;
    BlockConfig config;
    bool emulate = false;  // an emulation was asked for
    std::array<bool, kRunKinds> runs{};
    std::array<BlockResult, kRunKinds> r;
    std::array<std::vector<double>, kRunKinds> h;  // [tokens * top_k, D]
    // Per expert: chosen by a run of the derived (resp. source) weights; its NVFP4 w1 and w3
    // global scales differ (what the emulated loader changes).
    std::vector<char> chosen_derived, chosen_source, changed;
    int experts_changed = 0;
    // Set by the latent-output unit.
    evidence::ForwardLayer report;
    bool passed = false, emulation_differs = false;
    BlockResult derived;  // kept for --output (one layer)
    // Units in the work list, relative to the forward's first.
    size_t routing = 0;
    std::vector<size_t> units;  // the experts' and the shared expert's
    // Planned tensors, per unit.
    StreamTensors routing_tensors, routing_ahead, out_tensors;
    std::array<StreamTensors, 2> shared_tensors;  // derived, source: one unit each
    std::vector<StreamTensors> expert_tensors;  // one for gpt-oss (stacked experts)
    std::vector<ExpertGlobalScale> global_scales;
  };

  const Checkpoint* derived = nullptr;
  const Checkpoint* source = nullptr;
  const ForwardAuditOptions* options = nullptr;
  const ForwardDevice* device = nullptr;
  BlockInput input;
  evidence::ForwardInput input_ref;
  std::vector<Layer> layers;

  const BlockStages& StagesOf(RunKind k) const {
    static const BlockStages kCpuStages = CpuStages();
    return k == kCpu ? kCpuStages : device->stages;
  }

  // The routing unit: every run's routing and expert input, which experts they chose, and for
  // the emulation which experts it changes.
  absl::Status Route(Layer& l) const {
    const Precision p = options->precision;
    const size_t slots = static_cast<size_t>(input.tokens) * l.config.top_k;
    const size_t D = l.config.latent > 0 ? l.config.latent : l.config.hidden;
    BlockWeights w;
    if (absl::Status s = LoadBlockPart(*derived, l.config, l.layer, BlockPart::kRouting, {}, &w);
        !s.ok()) {
      return s;
    }
    for (RunKind k : {kDerived, kRerun, kCpu}) {
      if (!l.runs[k]) continue;
      if (absl::Status s = StagesOf(k).route(l.config, w, input, p, &l.r[k]); !s.ok()) {
        return InLayer(s, *derived, l.layer);
      }
    }
    l.chosen_derived.assign(l.config.experts, 0);
    l.chosen_source.assign(l.config.experts, 0);
    for (RunKind k : {kDerived, kRerun, kCpu}) {
      if (!l.runs[k]) continue;
      for (int32_t id : l.r[k].topk_ids) {
        if (id < 0 || id >= l.config.experts) {
          return absl::InternalError(absl::StrCat("routing chose expert ", id));
        }
        l.chosen_derived[id] = 1;
      }
    }
    if (l.runs[kSource]) {
      BlockWeights ws;
      if (absl::Status s =
              LoadBlockPart(*source, l.config, l.layer, BlockPart::kRouting, {}, &ws);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = device->stages.route(l.config, ws, input, p, &l.r[kSource]);
          !s.ok()) {
        return InLayer(s, *source, l.layer);
      }
      for (int32_t id : l.r[kSource].topk_ids) {
        if (id < 0 || id >= l.config.experts) {
          return absl::InternalError(absl::StrCat("routing chose expert ", id));
        }
        l.chosen_source[id] = 1;
      }
    }
    for (RunKind k : {kDerived, kRerun, kSource, kCpu, kEmulated}) {
      if (l.runs[k]) l.h[k].assign(slots * D, 0.0);
    }
    l.changed.assign(l.config.experts, 0);
    if (l.emulate) {
      for (const ExpertGlobalScale& g : l.global_scales) {
        auto w1 = quant::ReadScalarF32(g.w1);
        if (!w1.ok()) return w1.status();
        auto w3 = quant::ReadScalarF32(g.w3);
        if (!w3.ok()) return w3.status();
        // Compared as bits: a NaN or signed-zero global scale counts as differing too.
        if (std::bit_cast<uint32_t>(*w1) != std::bit_cast<uint32_t>(*w3)) {
          l.changed[g.expert] = 1;
          ++l.experts_changed;
        }
      }
    }
    return absl::OkStatus();
  }

  // An expert unit: `ids` (one expert, or every expert of a stacked gpt-oss block), each run on
  // the rows whose routing chose it.
  absl::Status Experts(Layer& l, const std::vector<int>& ids) const {
    const Precision p = options->precision;
    std::vector<int> on_derived, on_source;
    for (int e : ids) {
      if (l.chosen_derived[e]) on_derived.push_back(e);
      if (l.chosen_source[e]) on_source.push_back(e);
    }
    if (!on_derived.empty()) {
      BlockWeights w;
      if (absl::Status s =
              LoadBlockPart(*derived, l.config, l.layer, BlockPart::kExpert, on_derived, &w);
          !s.ok()) {
        return s;
      }
      ExpertSet set;
      for (int e : on_derived) set.emplace_back(e, &w.experts[e]);
      for (RunKind k : {kDerived, kRerun, kCpu}) {
        if (!l.runs[k]) continue;
        if (absl::Status s = StagesOf(k).experts(l.config, set, input, l.r[k], p, &l.h[k]);
            !s.ok()) {
          return InLayer(s, *derived, l.layer);
        }
      }
      if (l.runs[kEmulated]) {
        // Experts the emulated loader changes are recomputed; the others give the derived
        // run's rows (it was shown deterministic by its re-run).
        const size_t D = l.config.latent > 0 ? l.config.latent : l.config.hidden;
        for (int e : on_derived) {
          if (l.changed[e]) {
            ExpertWeights collapsed = w.experts[e];
            collapsed.up.global = collapsed.gate.global;
            const ExpertSet one = {{e, &collapsed}};
            if (absl::Status s = device->stages.experts(l.config, one, input, l.r[kDerived], p,
                                                        &l.h[kEmulated]);
                !s.ok()) {
              return InLayer(s, *derived, l.layer);
            }
            continue;
          }
          const std::vector<int32_t>& ids_of = l.r[kDerived].topk_ids;
          for (size_t i = 0; i < ids_of.size(); ++i) {
            if (ids_of[i] != e) continue;
            std::copy_n(l.h[kDerived].begin() + i * D, D, l.h[kEmulated].begin() + i * D);
          }
        }
      }
    }
    if (!on_source.empty()) {
      BlockWeights w;
      if (absl::Status s =
              LoadBlockPart(*source, l.config, l.layer, BlockPart::kExpert, on_source, &w);
          !s.ok()) {
        return s;
      }
      ExpertSet set;
      for (int e : on_source) set.emplace_back(e, &w.experts[e]);
      if (absl::Status s =
              device->stages.experts(l.config, set, input, l.r[kSource], p, &l.h[kSource]);
          !s.ok()) {
        return InLayer(s, *source, l.layer);
      }
    }
    return absl::OkStatus();
  }

  // A shared-expert unit, one per tree (the largest dense weights of a block).
  absl::Status Shared(Layer& l, bool on_source) const {
    const Precision p = options->precision;
    const Checkpoint& ckpt = on_source ? *source : *derived;
    BlockWeights w;
    if (absl::Status s = LoadBlockPart(ckpt, l.config, l.layer, BlockPart::kShared, {}, &w);
        !s.ok()) {
      return s;
    }
    for (RunKind k : {kDerived, kRerun, kSource, kCpu}) {
      if (!l.runs[k] || (k == kSource) != on_source) continue;
      if (absl::Status s = StagesOf(k).shared(l.config, w, input, p, &l.r[k]); !s.ok()) {
        return InLayer(s, ckpt, l.layer);
      }
    }
    return absl::OkStatus();
  }

  // The latent-output unit: every run finished, then the layer's report (as a whole-block
  // forward gives it, docs/forward.md).
  absl::Status Finish(Layer& l) const {
    const Precision p = options->precision;
    BlockWeights w;
    if (absl::Status s =
            LoadBlockPart(*derived, l.config, l.layer, BlockPart::kLatentOut, {}, &w);
        !s.ok()) {
      return s;
    }
    bool emulated_changes = false;
    if (l.runs[kEmulated]) {
      for (int e = 0; e < l.config.experts; ++e) {
        emulated_changes = emulated_changes || (l.changed[e] && l.chosen_derived[e]);
      }
      l.r[kEmulated] = l.r[kDerived];  // routing and shared expert: the stored weights'
    }
    for (RunKind k : {kDerived, kRerun, kCpu}) {
      if (!l.runs[k]) continue;
      if (absl::Status s = StagesOf(k).finish(l.config, w, l.h[k], p, &l.r[k]); !s.ok()) {
        return InLayer(s, *derived, l.layer);
      }
    }
    if (l.runs[kEmulated]) {
      // Unchanged weights give the stored run's bits (the re-run showed it deterministic).
      if (!emulated_changes) {
        l.r[kEmulated] = l.r[kDerived];
      } else if (absl::Status s = device->stages.finish(l.config, w, l.h[kEmulated], p,
                                                        &l.r[kEmulated]);
                 !s.ok()) {
        return InLayer(s, *derived, l.layer);
      }
    }
    if (l.runs[kSource]) {
      BlockWeights ws;
      if (absl::Status s =
              LoadBlockPart(*source, l.config, l.layer, BlockPart::kLatentOut, {}, &ws);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = device->stages.finish(l.config, ws, l.h[kSource], p, &l.r[kSource]);
          !s.ok()) {
        return InLayer(s, *source, l.layer);
      }
    }
    Report(l);
    for (std::vector<double>& h : l.h) std::vector<double>().swap(h);
    return absl::OkStatus();
  }

  void Report(Layer& l) const {
    const Precision p = options->precision;
    const ResultDiff determinism = CompareResults(l.r[kDerived], l.r[kRerun], p);
    evidence::ForwardLayer& report = l.report;
    report.layer = l.layer;
    report.family = FamilyName(l.config.family);
    report.derived = RunOf(derived->root(), l.r[kDerived], p);
    report.determinism = DiffOf(determinism);
    bool passed = determinism.bitwise_equal();
    if (l.runs[kSource]) {
      const ResultDiff diff = CompareResults(l.r[kSource], l.r[kDerived], p);
      report.source = RunOf(source->root(), l.r[kSource], p);
      report.source_vs_derived = DiffOf(diff);
      passed = passed && diff.bitwise_equal();
    }
    if (l.runs[kCpu]) report.device_vs_cpu = DeviceVsCpu(l.r[kDerived], l.r[kCpu], p);
    if (l.runs[kEmulated]) {
      const BlockResult& reference = l.runs[kSource] ? l.r[kSource] : l.r[kDerived];
      const ResultDiff diff = CompareResults(reference, l.r[kEmulated], p);
      l.emulation_differs = !diff.bitwise_equal();
      report.backend_emulation = evidence::ForwardEmulation{
          EmulationName(options->emulation),
          l.experts_changed,
          l.runs[kSource] ? "source" : "derived",
          ToHex(Sha256Of(TensorBytes(l.r[kEmulated], "output", p))),
          DiffOf(diff),
          diff.bitwise_equal() ? "bit-identical" : "different"};
    }
    report.verdict = VerdictOf(l.runs[kSource], passed);
    l.passed = passed;
    l.derived = std::move(l.r[kDerived]);
    for (BlockResult& r : l.r) r = BlockResult();
  }
};

StreamedForward::StreamedForward(std::unique_ptr<State> state) : state_(std::move(state)) {}
StreamedForward::~StreamedForward() = default;

absl::StatusOr<std::unique_ptr<StreamedForward>> StreamedForward::Plan(
    const Checkpoint& derived, const Checkpoint* source, std::vector<int> layers,
    const ForwardAuditOptions& o, const ForwardDevice& device) {
  auto state = std::make_unique<State>();
  state->derived = &derived;
  state->source = source;
  state->options = &o;
  state->device = &device;
  if (layers.empty()) return absl::InvalidArgumentError("no layer to run the forward on");
  for (int layer : layers) {
    State::Layer l;
    l.layer = layer;
    auto cfg = ParseBlockConfig(derived.text_config(), layer);
    if (!cfg.ok()) {
      return absl::Status(cfg.status().code(),
                          absl::StrCat(derived.root(), ": ", cfg.status().message()));
    }
    l.config = *cfg;
    if (source != nullptr) {
      auto scfg = ParseBlockConfig(source->text_config(), layer);
      if (!scfg.ok()) {
        return absl::Status(scfg.status().code(),
                            absl::StrCat(source->root(), ": ", scfg.status().message()));
      }
      if (!SameShape(*scfg, l.config)) {
        return absl::InvalidArgumentError(absl::StrCat(source->root(), " and ", derived.root(),
                                                       ": layer ", layer,
                                                       " blocks differ in shape or family"));
      }
    }
    l.emulate = o.emulation != Emulation::kNone;
    l.runs = {true, true, source != nullptr, device.name != "cpu", l.emulate};
    const BlockConfig& c = l.config;
    for (const Checkpoint* ckpt : {&derived, source}) {
      if (ckpt == nullptr) continue;
      StreamTensors* shared = &l.shared_tensors[ckpt == source];
      auto add = [&](BlockPart part, int expert, StreamTensors* out) -> absl::Status {
        auto refs = BlockPartTensors(*ckpt, c, layer, part, expert);
        if (!refs.ok()) return refs.status();
        AddTensors(*refs, out);
        return absl::OkStatus();
      };
      for (const auto& [part, out] : {std::pair{BlockPart::kRouting, &l.routing_tensors},
                                      std::pair{BlockPart::kShared, shared},
                                      std::pair{BlockPart::kLatentOut, &l.out_tensors}}) {
        if (absl::Status s = add(part, -1, out); !s.ok()) return s;
      }
      const int units = c.family == BlockFamily::kGptOss ? 1 : c.experts;
      l.expert_tensors.resize(units);
      for (int e = 0; e < units; ++e) {
        if (absl::Status s = add(BlockPart::kExpert, e, &l.expert_tensors[e]); !s.ok()) return s;
      }
    }
    // The routing weights are read when the cursor reaches the layer's experts' weights (each
    // expert's largest tensor in each file: not its few-byte global scales, which a shard may
    // store far ahead of everything else), wherever they lie after them; the emulation's
    // global scales come with them (a few bytes per expert).
    for (const StreamTensors& t : l.expert_tensors) {
      std::map<const SafetensorsFile*, const TensorInfo*> largest;
      for (const auto& [file, info] : t) {
        const TensorInfo*& at = largest[file];
        if (at == nullptr || info->num_bytes() > at->num_bytes()) at = info;
      }
      for (const auto& [file, info] : largest) l.routing_ahead.push_back({file, info});
    }
    if (l.emulate) {
      l.global_scales = ExpertGlobalScales(derived, c, layer);
      for (const ExpertGlobalScale& g : l.global_scales) {
        l.routing_tensors.push_back({g.w1.file, g.w1.info});
        l.routing_tensors.push_back({g.w3.file, g.w3.info});
      }
    }
    state->layers.push_back(std::move(l));
  }
  auto input = MakeInput(o, state->layers.front().config.hidden);
  if (!input.ok()) return input.status();
  for (const State::Layer& l : state->layers) {
    if (static_cast<size_t>(l.config.hidden) * input->first.tokens !=
        input->first.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          derived.root(), ": layer ", l.layer, " has hidden size ", l.config.hidden,
          ", the input has ", input->first.values.size() / input->first.tokens));
    }
  }
  state->input = std::move(input->first);
  state->input_ref = std::move(input->second);
  return std::unique_ptr<StreamedForward>(new StreamedForward(std::move(state)));
}

std::vector<StreamWork> StreamedForward::Work(size_t first) {
  State& st = *state_;
  std::vector<StreamWork> work;
  for (State::Layer& l : st.layers) {
    const std::string name = absl::StrCat("block_forward layer ", l.layer);
    l.routing = work.size();
    StreamWork routing{name + " routing", std::move(l.routing_tensors),
                       [&st, &l] { return st.Route(l); }};
    routing.read_ahead_from = std::move(l.routing_ahead);
    work.push_back(std::move(routing));
    std::vector<size_t> before_finish = {first + l.routing};
    const bool stacked = l.config.family == BlockFamily::kGptOss;
    for (size_t e = 0; e < l.expert_tensors.size(); ++e) {
      std::vector<int> ids;
      if (stacked) {
        for (int i = 0; i < l.config.experts; ++i) ids.push_back(i);
      } else {
        ids.push_back(static_cast<int>(e));
      }
      StreamWork unit{absl::StrCat(name, stacked ? " experts" : absl::StrCat(" expert ", e)),
                      std::move(l.expert_tensors[e]),
                      [&st, &l, ids] { return st.Experts(l, ids); },
                      {first + l.routing}};
      if (!stacked) {
        unit.wanted = [&l, e] { return l.chosen_derived[e] || l.chosen_source[e]; };
      }
      before_finish.push_back(first + work.size());
      work.push_back(std::move(unit));
    }
    for (bool on_source : {false, true}) {
      if (on_source && st.source == nullptr) continue;
      before_finish.push_back(first + work.size());
      work.push_back({name + (on_source ? " shared expert (source)" : " shared expert"),
                      std::move(l.shared_tensors[on_source]),
                      [&st, &l, on_source] { return st.Shared(l, on_source); }});
    }
    work.push_back({name + " latent output", std::move(l.out_tensors),
                    [&st, &l] { return st.Finish(l); }, std::move(before_finish)});
    l.expert_tensors.clear();
  }
  return work;
}

absl::StatusOr<ForwardAuditResult> StreamedForward::Finish(const std::string& spec) {
  State& st = *state_;
  const ForwardAuditOptions& o = *st.options;
  evidence::BlockForward report = Header(*st.device, o, st.input_ref);
  report.family = FamilyName(st.layers.front().config.family);
  bool passed = true, emulation_differs = false;
  for (State::Layer& l : st.layers) {
    passed = passed && l.passed;
    emulation_differs = emulation_differs || l.emulation_differs;
    report.layers_passed += l.passed;
    report.layers.push_back(std::move(l.report));
  }
  if (!spec.empty()) {
    report.layer_spec = spec;
    report.verdict = VerdictOf(st.source != nullptr, passed);
    return ForwardAuditResult{std::move(report), passed, emulation_differs};
  }
  State::Layer& l = st.layers.front();
  report.verdict = report.layers.front().verdict;
  if (!o.output_path.empty()) {
    absl::Status s = WriteBlockResult(o.output_path, l.config, st.input, l.derived, o.precision,
                                      {{"root", st.derived->root()},
                                       {"layer", std::to_string(l.layer)},
                                       {"device", st.device->name},
                                       {"precision", PrecisionName(o.precision)}});
    if (!s.ok()) return s;
    report.output_file = o.output_path;
  }
  return ForwardAuditResult{std::move(report), passed, emulation_differs};
}

}  // namespace ckpt::forward
