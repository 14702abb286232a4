// The forward diff audit behind `ckpt-audit forward` (run by core/audit/forward_check.h
// RunForward): one layer's block (or every requested MoE layer) on the derived checkpoint (and
// on the source, when given) on a device, then report bitwise equality, max |diff|, differing
// elements and ULP histograms per tensor, SHA-256 of every output tensor, a determinism re-run,
// for a non-CPU device its relative error against the CPU reference, and optionally the derived
// side as a serving backend would compute it (docs/forward.md "Backend emulation").
//
// The report is typed (core/evidence/block_forward.h: magnitudes are exact decimal strings), ready
// to go into a signed evidence record; its JSON is written there. The device is injected as
// BlockStages (block_forward.h) so that core/ does not depend on gpu/. The checkpoints are read
// once through the bounded stream, holding only what the tokens route to
// (core/forward/forward_stream.h; docs/forward.md, "Streamed").
#ifndef CKPT_CORE_FORWARD_FORWARD_AUDIT_H_
#define CKPT_CORE_FORWARD_FORWARD_AUDIT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/evidence/block_forward.h"
#include "core/forward/block_forward.h"
#include "core/io/tree_image.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

// The most tokens of a seeded input: its [tokens, hidden] activations and each expert's share
// of them stay in the hundreds of megabytes at real geometry (hidden 7168).
inline constexpr int64_t kMaxTokens = 4096;

// What the evidence records about a GPU a forward ran on.
struct GpuProperties {
  std::string name;    // e.g. "NVIDIA H200"
  std::string sm;      // compute capability, e.g. "9.0"
  std::string driver;  // e.g. "580.159.04 (CUDA 13.0)": kernel driver, CUDA version it supports
  std::string cuda;    // CUDA runtime the binary carries, e.g. "13.0"
};

struct ForwardDevice {
  std::string name;  // "cpu", "cuda"
  std::string description;
  BlockStages stages;
  std::optional<GpuProperties> gpu;  // set for GPU devices
};

ForwardDevice CpuDevice();

// How the derived side is computed: as stored, or as a serving backend's loader would.
//   kVllmW13Collapse  vLLM's NVFP4 MoE loaders use w1's global scale for w3 too, without
//                     rescaling w3's block scales (docs/formats.md §5); MXFP4 experts have no
//                     global scale and are unchanged.
enum class Emulation { kNone, kVllmW13Collapse };
std::string EmulationName(Emulation e);
absl::StatusOr<Emulation> ParseEmulation(const std::string& s);  // "", "none", "vllm-w13-collapse"

// The MoE layers a spec names: "all" (every layer of num_hidden_layers that is not dense, per
// first_k_dense_replace; gpt-oss: every layer) or a comma-separated list of layer indices
// ("1,2"), each an MoE layer, without repeats. INVALID_ARGUMENT naming the bad item.
absl::StatusOr<std::vector<int>> ResolveLayers(const std::string& spec,
                                               const nlohmann::json& text_config);

struct ForwardAuditOptions {
  std::string root;    // the derived checkpoint (or the only one)
  std::string source;  // optional: the source checkpoint to compare against
  int layer = 1;
  int64_t tokens = 8;  // for the seeded input (1..kMaxTokens); an --input file sets its own
  uint64_t seed = 0;
  Precision precision = Precision::kF64;
  std::string input_path;   // optional safetensors with BF16 `input`
  std::string output_path;  // optional: where the derived run's tensors are written (one layer)
  Emulation emulation = Emulation::kNone;
  // The read (core/io/tree_stream.h): bytes of checkpoint data held at once, threads.
  uint64_t memory_window = kDefaultMemoryWindow;
  unsigned threads = 0;
};

struct ForwardAuditResult {
  evidence::BlockForward report;
  // Source and derived bit-identical (or no source) and the re-run bit-identical.
  bool passed = false;
  // With an emulation: the emulated derived output differs from the reference (a measured
  // backend hazard; it does not change `passed`).
  bool emulation_differs = false;
};

// Read statistics of a forward (core/audit/forward_check.h RunForward).
struct ForwardReadStats {
  uint64_t bytes_read = 0;
  uint64_t peak_kept_bytes = 0;  // at most the memory window
};

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_FORWARD_AUDIT_H_
