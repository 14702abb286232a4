// `ckpt-audit forward`: run one layer's MoE block (`--layer L`) or several (`--layers all|L1,..`)
// on a derived checkpoint (and its source) on the CPU reference or the CUDA kernels, optionally
// emulating a serving backend's loader, and report whether the outputs are bit-identical
// (core/forward/forward_audit.h; docs/forward.md). Both trees are read once in
// --memory-window, holding only the experts the tokens route to.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  std::string memory_window;
  bool json = false;
};

// A byte count ("1048576") or a binary size ("256M" = 256 MiB, "1.5G", "2GiB"). INVALID_ARGUMENT
// naming the flag for anything else, 0, a value below one read chunk (64 KiB), a fraction of a
// byte, or more than 2^64 - 1. (A minimal parser: the shared one in cli_util replaces it.)
absl::StatusOr<uint64_t> ParseMemoryWindow(const std::string& text) {
  constexpr uint64_t kMinimum = 64 << 10;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--memory-window '", text, "': ", why));
  };
  using u128 = unsigned __int128;
  const u128 kMax = std::numeric_limits<uint64_t>::max();
  size_t i = 0;
  u128 whole = 0, frac = 0, scale = 1;
  for (; i < text.size() && absl::ascii_isdigit(text[i]); ++i) {
    whole = whole * 10 + (text[i] - '0');
    if (whole > kMax) return bad("too large (at most 2^64 - 1 bytes)");
  }
  if (i == 0) return bad("expected a byte count or a size such as 256M, 1.5G or 2GiB");
  if (i < text.size() && text[i] == '.') {
    const size_t start = ++i;
    for (; i < text.size() && absl::ascii_isdigit(text[i]) && i - start < 18; ++i) {
      frac = frac * 10 + (text[i] - '0');
      scale *= 10;
    }
    if (i == start) return bad("expected digits after '.'");
  }
  const std::string unit = absl::AsciiStrToUpper(text.substr(i));
  int shift = 0;
  if (!unit.empty() && unit != "B") {
    const size_t at = std::string("KMGT").find(unit[0]);
    if (at == std::string::npos || (unit.size() > 1 && unit.substr(1) != "I" &&
                                         unit.substr(1) != "IB")) {
      return bad("unknown unit (K, M, G or T, binary: 1K = 1024 bytes)");
    }
    shift = 10 * static_cast<int>(at + 1);
  }
  if ((frac << shift) % scale != 0) return bad("not a whole number of bytes");
  if (whole > (kMax >> shift)) return bad("too large (at most 2^64 - 1 bytes)");
  const u128 value = (whole << shift) + (frac << shift) / scale;
  if (value > kMax) return bad("too large (at most 2^64 - 1 bytes)");
  if (value < kMinimum) return bad(absl::StrCat("below one read chunk (", kMinimum, " bytes)"));
  return static_cast<uint64_t>(value);
}

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
  if (!a.memory_window.empty()) {
    auto window = ParseMemoryWindow(a.memory_window);
    if (!window.ok()) return ReportError(window.status());
    o.memory_window = *window;
  }
  o.precision = *p;
  o.emulation = *emulation;
  o.layer = a.layer;
  auto r = a.layers.empty() ? forward::RunForwardAudit(o, *device)
                            : forward::RunModelForward(a.layers, o, *device);
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
  cmd->add_option("--root", a->options.root, "derived (or only) checkpoint root")->required();
  cmd->add_option("--source", a->options.source, "source checkpoint root to compare against");
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
  cmd->add_option("--memory-window", a->memory_window,
                  "checkpoint bytes held in memory at most, both trees (default 1.5G; e.g. "
                  "256M, 2GiB)");
  cmd->add_option("--threads", a->options.threads, "reading threads (0: all cores)");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
