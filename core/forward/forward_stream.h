// The block forward as work for the one bounded read (core/io/tree_stream.h; docs/forward.md,
// "Streamed: only what the tokens route to").
//
// Each requested layer is read in units, each run as soon as its tensors (on both trees) are in:
//   routing        the router, its biases and the latent down projection (a few tens of MB),
//                  read ahead when the file's cursor reaches the layer's experts; computes the
//                  routing and the expert input of every run (derived, its re-run, source, the
//                  CPU reference, the emulated backend) first.
//   expert e       one per expert, on both trees; wanted only if some run's routing chose it:
//                  the others are hashed as they stream past and never held. Writes the rows
//                  (token, slot) of the runs that chose it.
//   shared expert  its three matrices, on both trees.
//   latent output  the up projection and norm (none for families without a latent), after all
//                  of the above: adds each token's expert rows in top-k slot order (the order
//                  RunBlockCpu and the CUDA combine use, so the bits are those of a whole-block
//                  run), finishes every run and builds the layer's report.
// The units write disjoint parts of their layer's state; the stream orders the rest.
#ifndef CKPT_CORE_FORWARD_FORWARD_STREAM_H_
#define CKPT_CORE_FORWARD_FORWARD_STREAM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/forward/forward_audit.h"
#include "core/io/tree_stream.h"

namespace ckpt::forward {

class StreamedForward {
 public:
  // Plans `layers` (ResolveLayers' result) from the checkpoints' headers; `source` may be null.
  // Both checkpoints, `options` and `device` must outlive the object. Errors: a layer that is
  // not an MoE block, a missing or mis-shaped tensor (named), source and derived blocks of
  // different shapes, an unusable input.
  static absl::StatusOr<std::unique_ptr<StreamedForward>> Plan(const Checkpoint& derived,
                                                               const Checkpoint* source,
                                                               std::vector<int> layers,
                                                               const ForwardAuditOptions& options,
                                                               const ForwardDevice& device);
  ~StreamedForward();

  // The work items for StreamTrees (call once); `first` is the index the first of them has in
  // the list StreamTrees gets (their `after` indices count from it).
  std::vector<StreamWork> Work(size_t first);

  // After StreamTrees ran the work: the report of every layer for a non-empty `spec` (schema
  // ckpt-audit.model-forward/1), else the one layer's report (writing options.output_path
  // when set).
  absl::StatusOr<ForwardAuditResult> Finish(const std::string& spec);

 private:
  struct State;
  explicit StreamedForward(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_FORWARD_STREAM_H_
