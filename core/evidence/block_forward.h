// The block forward's result (core/forward/forward_audit.h) as typed values: per layer, the
// output digests of each run, the bitwise comparisons, the device-vs-CPU error and the backend
// emulation; over the layers, a summary row each and the verdict. core/forward fills these; the
// JSON the record's "block_forward" and `ckpt-audit forward --json` carry is written from them
// here, once (docs/evidence.md "Where JSON is produced"). Magnitudes are exact decimal strings,
// so the report cannot carry a float.
#ifndef CKPT_CORE_EVIDENCE_BLOCK_FORWARD_H_
#define CKPT_CORE_EVIDENCE_BLOCK_FORWARD_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/evidence/environment.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

// ULP-distance buckets: 0, 1, 2-3, 4-15, 16-255, 256 and more.
inline constexpr int kForwardUlpBuckets = 6;

// One tensor of two runs compared bit for bit.
struct ForwardTensorDiff {
  std::string name;
  uint64_t elements = 0;
  uint64_t differing = 0;    // elements whose bits differ
  std::string max_abs_diff;  // exact decimal
  std::array<uint64_t, kForwardUlpBuckets> ulp_histogram{};
};

// Every tensor of a block's result, in the order of the oracle file.
struct ForwardDiff {
  std::vector<ForwardTensorDiff> tensors;
  bool bitwise_equal() const;
  const ForwardTensorDiff* Find(const std::string& name) const;
};

// One run: the checkpoint it read and the SHA-256 of each output tensor.
struct ForwardRun {
  std::string root;
  std::vector<std::pair<std::string, std::string>> tensor_sha256;  // name, hex
  std::string OutputSha256() const;  // the "output" tensor's
};

// A non-CPU device's run against the CPU reference.
struct ForwardDeviceVsCpu {
  std::string cpu_precision;
  bool topk_ids_equal = false;
  std::vector<std::pair<std::string, std::string>> max_relative_error;  // tensor, decimal
};

// The derived side computed as a serving backend would load it (docs/forward.md).
struct ForwardEmulation {
  std::string name;  // e.g. "vllm-w13-collapse"
  int64_t experts_changed = 0;
  std::string compared_against;  // "source" | "derived"
  std::string output_sha256;
  ForwardDiff vs_reference;
  std::string verdict;  // "bit-identical" | "different"
};

struct ForwardLayer {
  int64_t layer = 0;
  std::string family;
  ForwardRun derived;
  ForwardDiff determinism;  // the derived run against its re-run
  std::optional<ForwardRun> source;
  std::optional<ForwardDiff> source_vs_derived;
  std::optional<ForwardDeviceVsCpu> device_vs_cpu;
  std::optional<ForwardEmulation> backend_emulation;
  std::string verdict;  // "bit-identical" | "different" | "deterministic" | "nondeterministic"
};

struct ForwardInput {
  std::string origin;  // "file" | "seed"
  std::string path;    // origin "file"
  uint64_t seed = 0;   // origin "seed"
  int64_t tokens = 0;
  std::string sha256;
};

// A forward's report: one layer (schema ckpt-audit.forward/1, `layer_spec` empty) or several
// (ckpt-audit.model-forward/1: `layer_spec` as requested, a summary row per layer).
struct BlockForward {
  std::string device;  // "cpu", "cuda"
  std::string device_description;
  std::optional<GpuInfo> device_properties;
  std::string precision;
  ForwardInput input;
  std::string emulation;  // empty: none
  std::string family;      // of the (first) layer
  std::string layer_spec;  // "all" or "L1,L2,...": several layers
  std::vector<ForwardLayer> layers;
  int64_t layers_passed = 0;
  std::string verdict;
  std::string output_file;  // one layer: where its tensors were written, if asked

  bool multi_layer() const { return !layer_spec.empty(); }
  nlohmann::json ToJson() const;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_BLOCK_FORWARD_H_
