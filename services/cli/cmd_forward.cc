// `ckpt-audit forward`: run one layer's MoE block (`--layer L`) or several (`--layers all|L1,..`)
// on a derived checkpoint (and its source) on the CPU reference or the CUDA kernels, optionally
// emulating a serving backend's loader, and report whether the outputs are bit-identical
// (core/forward/forward_audit.h; docs/forward.md). Both trees are read once in
// --memory-window, holding only the experts the tokens route to.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/audit/forward_check.h"
#include "core/forward/forward_audit.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/forward_device.h"

namespace ckpt::cli {
namespace {

struct ForwardArgs {
  forward::ForwardAuditOptions options;
  int layer = -1;
  std::string layers;
  std::string device = "cpu";
  std::string precision;  // default: f64 on cpu, bf16 on cuda
  std::string emulate;
  bool json = false;
};

void PrintHeader(const evidence::BlockForward& r) {
  std::printf("%s on %s", r.family.c_str(), r.device.c_str());
  if (const auto& p = r.device_properties) {
    std::printf(" (%s, sm %s, driver %s, CUDA %s)", p->name.c_str(), p->sm.c_str(),
                p->driver.c_str(), p->cuda.c_str());
  }
  std::printf(", precision %s, %lld tokens%s\n", r.precision.c_str(),
              static_cast<long long>(r.input.tokens),
              r.emulation.empty() ? "" : absl::StrCat(", emulating ", r.emulation).c_str());
}

// A diff's tensors by name.
std::vector<const evidence::ForwardTensorDiff*> ByName(const evidence::ForwardDiff& d) {
  std::vector<const evidence::ForwardTensorDiff*> out;
  for (const evidence::ForwardTensorDiff& t : d.tensors) out.push_back(&t);
  std::sort(out.begin(), out.end(), [](const auto* a, const auto* b) { return a->name < b->name; });
  return out;
}

void PrintLayer(const evidence::ForwardLayer& r) {
  std::printf("layer %d\n", static_cast<int>(r.layer));
  if (r.source) std::printf("source  output sha256 %s\n", r.source->OutputSha256().c_str());
  std::printf("derived output sha256 %s\n", r.derived.OutputSha256().c_str());
  if (r.source_vs_derived) {
    for (const evidence::ForwardTensorDiff* t : ByName(*r.source_vs_derived)) {
      std::printf("  %-18s %s  differing %llu/%llu  max|diff| %s\n", t->name.c_str(),
                  t->differing == 0 ? "identical" : "DIFFERENT",
                  static_cast<unsigned long long>(t->differing),
                  static_cast<unsigned long long>(t->elements), t->max_abs_diff.c_str());
    }
  }
  std::printf("re-run bit-identical: %s\n", r.determinism.bitwise_equal() ? "yes" : "NO");
  if (const auto& d = r.device_vs_cpu) {
    std::string output = "-";
    for (const auto& [name, v] : d->max_relative_error) {
      if (name == "output") output = v;
    }
    std::printf("device vs cpu: output max relative error %s, topk ids %s\n", output.c_str(),
                d->topk_ids_equal ? "equal" : "DIFFER");
  }
  if (const auto& e = r.backend_emulation) {
    const evidence::ForwardTensorDiff* out = e->vs_reference.Find("output");
    std::printf("%s (%d experts changed) vs %s: output %s, differing %llu/%llu, max|diff| %s\n",
                e->name.c_str(), static_cast<int>(e->experts_changed),
                e->compared_against.c_str(), e->verdict.c_str(),
                static_cast<unsigned long long>(out ? out->differing : 0),
                static_cast<unsigned long long>(out ? out->elements : 0),
                out ? out->max_abs_diff.c_str() : "-");
  }
  std::printf("verdict: %s\n", r.verdict.c_str());
}

// "a/b/c/d/e/f" in bucket order.
std::string HistogramText(const evidence::ForwardTensorDiff& d) {
  std::string s;
  for (uint64_t n : d.ulp_histogram) absl::StrAppend(&s, s.empty() ? "" : "/", n);
  return s;
}

// The summary table: one row per layer.
void PrintSummary(const evidence::BlockForward& r) {
  std::printf("%-6s %-14s %-20s %-24s %-34s %s\n", "layer", "verdict", "differing output",
              "max|diff|", "ULPs 0/1/2-3/4-15/16-255/256+", "emulated: differing, max|diff|");
  for (const evidence::ForwardLayer& l : r.layers) {
    std::string differing = "-", max_diff = "-", hist = "-", emulated = "-";
    if (const evidence::ForwardTensorDiff* out =
            l.source_vs_derived ? l.source_vs_derived->Find("output") : nullptr) {
      differing = absl::StrCat(out->differing, "/", out->elements);
      max_diff = out->max_abs_diff;
      hist = HistogramText(*out);
    }
    if (const evidence::ForwardTensorDiff* out =
            l.backend_emulation ? l.backend_emulation->vs_reference.Find("output") : nullptr) {
      emulated = absl::StrCat(out->differing, ", ", out->max_abs_diff);
    }
    std::printf("%-6d %-14s %-20s %-24s %-34s %s\n", static_cast<int>(l.layer),
                l.verdict.c_str(), differing.c_str(), max_diff.c_str(), hist.c_str(),
                emulated.c_str());
  }
}

// The last line. When the emulated backend's output diverges (exit 1), that leads: the stored
// weights' verdict follows it.
void PrintVerdict(const evidence::BlockForward& r) {
  std::vector<std::string> diverging;
  for (const evidence::ForwardLayer& l : r.layers) {
    if (l.backend_emulation && l.backend_emulation->verdict != "bit-identical") {
      diverging.push_back(std::to_string(l.layer));
    }
  }
  std::string stored = r.verdict;
  if (r.multi_layer()) {
    absl::StrAppend(&stored, " (", r.layers_passed, " of ", r.layers.size(), " layers passed)");
  }
  if (diverging.empty()) {
    if (r.multi_layer()) std::printf("verdict: %s\n", stored.c_str());
    return;
  }
  std::printf("verdict: emulated %s output DIFFERS on %zu of %zu layers (layer%s %s); stored "
              "weights: %s\n",
              r.emulation.c_str(), diverging.size(), r.layers.size(),
              diverging.size() == 1 ? "" : "s", absl::StrJoin(diverging, ", ").c_str(),
              stored.c_str());
}

int Run(const ForwardArgs& a) {
  if ((a.layer >= 0) == !a.layers.empty()) {
    return ReportError(absl::InvalidArgumentError("give exactly one of --layer and --layers"));
  }
  auto device = ForwardDeviceByName(a.device);
  if (!device.ok()) return ReportError(device.status());
  std::string precision = a.precision;
  if (precision.empty()) precision = a.device == "cuda" ? "bf16" : "f64";
  auto p = forward::ParsePrecision(precision);
  if (!p.ok()) return ReportError(p.status());
  auto emulation = forward::ParseEmulation(a.emulate);
  if (!emulation.ok()) return ReportError(emulation.status());
  forward::ForwardAuditOptions o = a.options;
  o.precision = *p;
  o.emulation = *emulation;
  o.layer = a.layer;
  auto r = audit::RunForward(a.layers, o, *device);
  if (!r.ok()) return ReportError(r.status());
  if (a.json) {
    std::printf("%s\n", DumpJson(r->report.ToJson(), 2).c_str());
  } else {
    PrintHeader(r->report);
    for (const evidence::ForwardLayer& layer : r->report.layers) PrintLayer(layer);
    if (r->report.multi_layer()) PrintSummary(r->report);
    PrintVerdict(r->report);
  }
  return r->passed && !r->emulation_differs ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddForwardCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "forward", "Run MoE blocks on source and derived weights; report bit-exact diffs");
  auto a = std::make_shared<ForwardArgs>();
  AcceptHubRepoIds(cmd->add_option("--root", a->options.root, "derived (or only) checkpoint root"))
      ->required();
  AcceptHubRepoIds(
      cmd->add_option("--source", a->options.source, "source checkpoint root to compare against"));
  cmd->add_option("--layer", a->layer, "one layer index");
  cmd->add_option("--layers", a->layers, "all (every MoE layer) or L1,L2,...");
  cmd->add_option("--tokens", a->options.tokens, "tokens of the seeded input (default 8)");
  cmd->add_option("--seed", a->options.seed, "seed of the input (default 0)");
  cmd->add_option("--device", a->device, "cpu (default) or cuda");
  cmd->add_option("--precision", a->precision, "f64|f32|bf16 (default f64 on cpu, bf16 on cuda)");
  cmd->add_option("--input", a->options.input_path, "safetensors with BF16 'input' [T, hidden]");
  cmd->add_option("--output", a->options.output_path,
                  "write output and intermediates here (--layer only)");
  cmd->add_option("--emulate", a->emulate,
                  "also compute the derived side as a backend loads it: vllm-w13-collapse");
  AddMemoryWindowFlag(cmd, &a->options.memory_window);
  AddThreadsOption(cmd, &a->options.threads);
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
