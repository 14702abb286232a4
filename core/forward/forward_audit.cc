#include "core/forward/forward_audit.h"

#include <memory>

#include "absl/strings/str_cat.h"
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

}  // namespace

ForwardDevice CpuDevice() {
  return {"cpu", "CPU reference (core/forward)", RunBlockCpu};
}

absl::StatusOr<ForwardAuditResult> RunForwardAudit(const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto derived = Checkpoint::Open(o.root);
  if (!derived.ok()) return derived.status();
  std::unique_ptr<Checkpoint> source;
  if (!o.source.empty()) {
    auto s = Checkpoint::Open(o.source);
    if (!s.ok()) return s.status();
    source = *std::move(s);
  }
  return RunForwardAudit(**derived, source.get(), o, device);
}

absl::StatusOr<ForwardAuditResult> RunForwardAudit(const Checkpoint& derived_ckpt,
                                                   const Checkpoint* source_ckpt,
                                                   const ForwardAuditOptions& o,
                                                   const ForwardDevice& device) {
  auto derived = Load(derived_ckpt, o.layer);
  if (!derived.ok()) return derived.status();
  const BlockConfig& config = derived->config;

  BlockInput input;
  nlohmann::json input_json;
  if (!o.input_path.empty()) {
    auto in = ReadBlockInput(o.input_path, config.hidden);
    if (!in.ok()) return in.status();
    input = std::move(*in);
    input_json = {{"origin", "file"}, {"path", o.input_path}};
  } else {
    if (o.tokens <= 0 || o.tokens > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens must be in [1, 2^20], got ",
                                                     o.tokens));
    }
    input = SeededInput(o.tokens, config.hidden, o.seed);
    input_json = {{"origin", "seed"}, {"seed", std::to_string(o.seed)}};
  }
  input_json["tokens"] = input.tokens;
  input_json["sha256"] = ToHex(Sha256Of(InputBytes(input)));

  auto run = device.run(config, derived->weights, input, o.precision);
  if (!run.ok()) return run.status();
  auto rerun = device.run(config, derived->weights, input, o.precision);
  if (!rerun.ok()) return rerun.status();
  const ResultDiff determinism = CompareResults(*run, *rerun, o.precision);

  nlohmann::json report = {
      {"schema", "ckpt-audit.forward/1"},
      {"layer", o.layer},
      {"family", FamilyName(config.family)},
      {"device", device.name},
      {"device_description", device.description},
      {"precision", PrecisionName(o.precision)},
      {"input", input_json},
      {"derived", RunJson(derived->ckpt->root(), *run, o.precision)},
      {"determinism", {{"reruns", 1}, {"bitwise_equal", determinism.bitwise_equal()},
                       {"differing_elements", determinism.Find("output")->differing}}},
  };
  bool passed = determinism.bitwise_equal();

  if (source_ckpt != nullptr) {
    auto source = Load(*source_ckpt, o.layer);
    if (!source.ok()) return source.status();
    if (!SameShape(source->config, config)) {
      return absl::InvalidArgumentError(absl::StrCat(source_ckpt->root(), " and ",
                                                     derived_ckpt.root(), ": layer ", o.layer,
                                                     " blocks differ in shape or family"));
    }
    auto src = device.run(source->config, source->weights, input, o.precision);
    if (!src.ok()) return src.status();
    const ResultDiff diff = CompareResults(*src, *run, o.precision);
    report["source"] = RunJson(source->ckpt->root(), *src, o.precision);
    report["source_vs_derived"] = ToJson(diff);
    passed = passed && diff.bitwise_equal();
  }

  if (device.name != "cpu") {
    auto cpu = RunBlockCpu(config, derived->weights, input, o.precision);
    if (!cpu.ok()) return cpu.status();
    nlohmann::json rel = nlohmann::json::object();
    for (const auto& [name, a, b] :
         {std::tuple{"router_logits", &run->router_logits, &cpu->router_logits},
          std::tuple{"topk_weights", &run->topk_weights, &cpu->topk_weights},
          std::tuple{"latent_in", &run->latent_in, &cpu->latent_in},
          std::tuple{"latent_out_normed", &run->latent_out_normed, &cpu->latent_out_normed},
          std::tuple{"routed_out", &run->routed_out, &cpu->routed_out},
          std::tuple{"shared_out", &run->shared_out, &cpu->shared_out},
          std::tuple{"output", &run->output, &cpu->output}}) {
      rel[name] = ExactDecimal(MaxRelativeError(*a, *b));
    }
    report["device_vs_cpu"] = {{"cpu_precision", PrecisionName(o.precision)},
                               {"topk_ids_equal", run->topk_ids == cpu->topk_ids},
                               {"max_relative_error", rel},
                               {"relative_error_definition", "max|device - cpu| / max|cpu|"}};
  }

  if (!o.output_path.empty()) {
    absl::Status s = WriteBlockResult(o.output_path, config, input, *run, o.precision,
                                      {{"root", derived->ckpt->root()},
                                       {"layer", std::to_string(o.layer)},
                                       {"device", device.name},
                                       {"precision", PrecisionName(o.precision)}});
    if (!s.ok()) return s;
    report["output_file"] = o.output_path;
  }
  report["verdict"] = source_ckpt == nullptr ? (passed ? "deterministic" : "nondeterministic")
                      : passed         ? "bit-identical"
                                       : "different";
  return ForwardAuditResult{std::move(report), passed};
}

}  // namespace ckpt::forward
