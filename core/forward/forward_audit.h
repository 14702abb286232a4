// The forward diff audit behind `ckpt-audit forward`: run one layer's block on the derived
// checkpoint (and on the source, when given) on a device, then report bitwise equality, max
// |diff|, differing elements and ULP histograms per tensor, SHA-256 of every output tensor, a
// determinism re-run, and for a non-CPU device its relative error against the CPU reference.
//
// The report is a JSON object without floating-point numbers (magnitudes are decimal strings),
// ready to go into a signed evidence record. The device is injected as a BlockRunner so that
// core/ does not depend on gpu/.
#ifndef CKPT_CORE_FORWARD_FORWARD_AUDIT_H_
#define CKPT_CORE_FORWARD_FORWARD_AUDIT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/forward/block_forward.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

using BlockRunner = std::function<absl::StatusOr<BlockResult>(
    const BlockConfig&, const BlockWeights&, const BlockInput&, Precision)>;

struct ForwardDevice {
  std::string name;  // "cpu", "cuda"
  std::string description;
  BlockRunner run;
};

ForwardDevice CpuDevice();

struct ForwardAuditOptions {
  std::string root;    // the derived checkpoint (or the only one)
  std::string source;  // optional: the source checkpoint to compare against
  int layer = 1;
  int64_t tokens = 8;  // for the seeded input; an --input file sets its own
  uint64_t seed = 0;
  Precision precision = Precision::kF64;
  std::string input_path;   // optional safetensors with BF16 `input`
  std::string output_path;  // optional: where the derived run's tensors are written
};

struct ForwardAuditResult {
  nlohmann::json report;
  // Source and derived bit-identical (or no source) and the re-run bit-identical.
  bool passed = false;
};

// Errors (a checkpoint, config or input that cannot be used) are statuses; a difference is a
// result with passed = false.
absl::StatusOr<ForwardAuditResult> RunForwardAudit(const ForwardAuditOptions& options,
                                                   const ForwardDevice& device);
// The same on checkpoints already read (an audit's one read); `source` may be null. The
// options' root and source paths are not used.
absl::StatusOr<ForwardAuditResult> RunForwardAudit(const Checkpoint& derived,
                                                   const Checkpoint* source,
                                                   const ForwardAuditOptions& options,
                                                   const ForwardDevice& device);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_FORWARD_AUDIT_H_
