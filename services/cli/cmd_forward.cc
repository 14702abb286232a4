// `ckpt-audit forward`: run one layer's MoE block on a derived checkpoint (and its source) on
// the CPU reference or the CUDA kernels, and report whether the outputs are bit-identical
// (core/forward/forward_audit.h; docs/forward.md).
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/forward/forward_audit.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#ifdef CKPT_HAVE_CUDA
#include "gpu/block_forward_cuda.h"
#endif

namespace ckpt::cli {
namespace {

struct ForwardArgs {
  forward::ForwardAuditOptions options;
  std::string device = "cpu";
  std::string precision;  // default: f64 on cpu, bf16 on cuda
  bool json = false;
};

absl::StatusOr<forward::ForwardDevice> PickDevice(const std::string& name) {
  if (name == "cpu") return forward::CpuDevice();
  if (name == "cuda") {
#ifdef CKPT_HAVE_CUDA
    if (absl::Status s = gpu::CudaAvailable(); !s.ok()) return s;
    return gpu::CudaDevice();
#else
    return absl::FailedPreconditionError("this ckpt-audit was built without CUDA (no nvcc)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --device '", name, "' (cpu|cuda)"));
}

void PrintText(const nlohmann::json& r) {
  std::printf("layer %d (%s) on %s, precision %s, %lld tokens\n", r["layer"].get<int>(),
              r["family"].get<std::string>().c_str(), r["device"].get<std::string>().c_str(),
              r["precision"].get<std::string>().c_str(),
              static_cast<long long>(r["input"]["tokens"].get<int64_t>()));
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
  std::printf("verdict: %s\n", r["verdict"].get<std::string>().c_str());
}

}  // namespace

void AddForwardCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "forward", "Run an MoE block on source and derived weights; report bit-exact diffs");
  auto a = std::make_shared<ForwardArgs>();
  cmd->add_option("--root", a->options.root, "derived (or only) checkpoint root")->required();
  cmd->add_option("--source", a->options.source, "source checkpoint root to compare against");
  cmd->add_option("--layer", a->options.layer, "layer index")->required();
  cmd->add_option("--tokens", a->options.tokens, "tokens of the seeded input (default 8)");
  cmd->add_option("--seed", a->options.seed, "seed of the input (default 0)");
  cmd->add_option("--device", a->device, "cpu (default) or cuda");
  cmd->add_option("--precision", a->precision, "f64|f32|bf16 (default f64 on cpu, bf16 on cuda)");
  cmd->add_option("--input", a->options.input_path, "safetensors with BF16 'input' [T, hidden]");
  cmd->add_option("--output", a->options.output_path, "write output and intermediates here");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] {
    auto device = PickDevice(a->device);
    if (!device.ok()) {
      *exit_code = ReportError(device.status());
      return;
    }
    std::string precision = a->precision;
    if (precision.empty()) precision = a->device == "cuda" ? "bf16" : "f64";
    auto p = forward::ParsePrecision(precision);
    if (!p.ok()) {
      *exit_code = ReportError(p.status());
      return;
    }
    forward::ForwardAuditOptions o = a->options;
    o.precision = *p;
    auto r = forward::RunForwardAudit(o, *device);
    if (!r.ok()) {
      *exit_code = ReportError(r.status());
      return;
    }
    if (a->json) {
      std::printf("%s\n", DumpJson(r->report, 2).c_str());
    } else {
      PrintText(r->report);
    }
    *exit_code = r->passed ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace ckpt::cli
