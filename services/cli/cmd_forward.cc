// `ckpt-audit forward`: run one layer's MoE block (`--layer L`) or several (`--layers all|L1,..`)
// on a derived checkpoint (and its source) on the CPU reference or the CUDA kernels, optionally
// emulating a serving backend's loader, and report whether the outputs are bit-identical
// (core/forward/forward_audit.h; docs/forward.md).
#include <cstdio>

#include "absl/strings/str_cat.h"
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

std::string Str(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "-";
}

void PrintHeader(const nlohmann::json& r) {
  std::printf("%s on %s", r["family"].get<std::string>().c_str(),
              r["device"].get<std::string>().c_str());
  if (r.contains("device_properties")) {
    const auto& p = r["device_properties"];
    std::printf(" (%s, sm %s, driver %s, CUDA %s)", Str(p, "name").c_str(), Str(p, "sm").c_str(),
                Str(p, "driver").c_str(), Str(p, "cuda").c_str());
  }
  std::printf(", precision %s, %lld tokens%s\n", r["precision"].get<std::string>().c_str(),
              static_cast<long long>(r["input"]["tokens"].get<int64_t>()),
              r.contains("emulation") ? absl::StrCat(", emulating ",
                                                     r["emulation"].get<std::string>()).c_str()
                                      : "");
}

void PrintLayer(const nlohmann::json& r) {
  std::printf("layer %d\n", r["layer"].get<int>());
  if (r.contains("source")) {
    std::printf("source  output sha256 %s\n",
                r["source"]["output_sha256"].get<std::string>().c_str());
  }
  std::printf("derived output sha256 %s\n",
              r["derived"]["output_sha256"].get<std::string>().c_str());
  if (r.contains("source_vs_derived")) {
    for (const auto& [name, t] : r["source_vs_derived"]["tensors"].items()) {
      std::printf("  %-18s %s  differing %llu/%llu  max|diff| %s\n", name.c_str(),
                  t["bitwise_equal"].get<bool>() ? "identical" : "DIFFERENT",
                  static_cast<unsigned long long>(t["differing_elements"].get<uint64_t>()),
                  static_cast<unsigned long long>(t["elements"].get<uint64_t>()),
                  t["max_abs_diff"].get<std::string>().c_str());
    }
  }
  std::printf("re-run bit-identical: %s\n",
              r["determinism"]["bitwise_equal"].get<bool>() ? "yes" : "NO");
  if (r.contains("device_vs_cpu")) {
    std::printf("device vs cpu: output max relative error %s, topk ids %s\n",
                r["device_vs_cpu"]["max_relative_error"]["output"].get<std::string>().c_str(),
                r["device_vs_cpu"]["topk_ids_equal"].get<bool>() ? "equal" : "DIFFER");
  }
  if (r.contains("backend_emulation")) {
    const auto& e = r["backend_emulation"];
    const auto& out = e["vs_reference"]["tensors"]["output"];
    std::printf("%s (%d experts changed) vs %s: output %s, differing %llu/%llu, max|diff| %s\n",
                e["name"].get<std::string>().c_str(), e["experts_changed"].get<int>(),
                e["compared_against"].get<std::string>().c_str(),
                e["verdict"].get<std::string>().c_str(),
                static_cast<unsigned long long>(out["differing_elements"].get<uint64_t>()),
                static_cast<unsigned long long>(out["elements"].get<uint64_t>()),
                out["max_abs_diff"].get<std::string>().c_str());
  }
  std::printf("verdict: %s\n", r["verdict"].get<std::string>().c_str());
}

// "a/b/c/d/e/f" in bucket order (JSON objects sort their keys).
std::string HistogramText(const nlohmann::json& h) {
  std::string s;
  for (const char* bucket : {"0", "1", "2-3", "4-15", "16-255", "256+"}) {
    absl::StrAppend(&s, s.empty() ? "" : "/", h.value(bucket, uint64_t{0}));
  }
  return s;
}

// The summary table: one row per layer.
void PrintSummary(const nlohmann::json& r) {
  std::printf("%-6s %-14s %-20s %-24s %-34s %s\n", "layer", "verdict", "differing output",
              "max|diff|", "ULPs 0/1/2-3/4-15/16-255/256+", "emulated: differing, max|diff|");
  for (const auto& row : r["summary"]) {
    std::string differing = "-", hist = "-", emulated = "-";
    if (row.contains("output_differing_elements")) {
      differing = absl::StrCat(row["output_differing_elements"].get<uint64_t>(), "/",
                               row["output_elements"].get<uint64_t>());
      hist = HistogramText(row["output_ulp_histogram"]);
    }
    if (row.contains("emulated_verdict")) {
      emulated = absl::StrCat(row["emulated_output_differing_elements"].get<uint64_t>(), ", ",
                              row["emulated_output_max_abs_diff"].get<std::string>());
    }
    std::printf("%-6d %-14s %-20s %-24s %-34s %s\n", row["layer"].get<int>(),
                row["verdict"].get<std::string>().c_str(), differing.c_str(),
                Str(row, "output_max_abs_diff").c_str(), hist.c_str(), emulated.c_str());
  }
  std::printf("verdict: %s (%d of %d layers passed)\n", r["verdict"].get<std::string>().c_str(),
              r["layers_passed"].get<int>(), r["layers_run"].get<int>());
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
  auto r = a.layers.empty() ? forward::RunForwardAudit(o, *device)
                            : forward::RunModelForward(a.layers, o, *device);
  if (!r.ok()) return ReportError(r.status());
  if (a.json) {
    std::printf("%s\n", DumpJson(r->report, 2).c_str());
  } else {
    PrintHeader(r->report);
    if (a.layers.empty()) {
      PrintLayer(r->report);
    } else {
      for (const auto& layer : r->report["layers"]) PrintLayer(layer);
      PrintSummary(r->report);
    }
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
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
