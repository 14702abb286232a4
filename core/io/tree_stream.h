// The second half of an audit's one read (docs/audit-engine.md, "Memory"): the tensor data
// that ReadTree left unread under Keep::kStreamTensorData, read once, in a bounded window.
//
// Every deferred file is read front to back in chunks, each chunk hashed as it arrives (the
// file SHA-256 continues from the header ReadTree kept). A tensor is kept only while some
// piece of work still needs it: the caller lists work items (a check on a few tensors, e.g.
// one module of the derived checkpoint with its source partner); a tensor is read straight
// into a buffer of its own, lent to its SafetensorsFile (so Checkpoint and TensorRef readers
// see it), and an item runs on one of the stream's threads as soon as all its tensors are in.
// When the last item that needs a tensor has run, the buffer is freed. Work items earlier in
// the list have priority: the files whose next needed tensor serves the earliest item are read
// first, and memory is granted in that order.
//
// Kept bytes (the images' kept files and headers plus the tensors held) never exceed
// ReadOptions::memory_window. When the next tensor cannot be held and nothing in flight can
// free memory (a layout whose partners lie far apart), the stream stops with
// RESOURCE_EXHAUSTED naming the window and what is pending; it never grows past the window
// and never reads a byte twice. Between chunks it polls Progress::Cancelled (CANCELLED).
#ifndef CKPT_CORE_IO_TREE_STREAM_H_
#define CKPT_CORE_IO_TREE_STREAM_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/tree_image.h"
#include "core/progress.h"
#include "core/safetensors.h"

namespace ckpt {

// Work on tensor bytes: `run` is called once, on a stream thread, when every listed tensor's
// bytes are available through its SafetensorsFile (tensors of files kept whole always are).
struct StreamWork {
  std::string label;  // names the item in messages
  std::vector<std::pair<const SafetensorsFile*, const TensorInfo*>> tensors;
  std::function<absl::Status()> run;
};

struct StreamResult {
  // The input images with every deferred file completed (digests set, stream_from cleared,
  // bytes_read including this stream).
  std::vector<std::shared_ptr<const TreeImage>> images;
  uint64_t bytes_read = 0;       // by this stream
  uint64_t peak_kept_bytes = 0;  // kept files and headers plus tensors held, at most the window
};

// `images` were read by ReadTree with Keep::kStreamTensorData and `options` (digests, window,
// threads). Errors: RESOURCE_EXHAUSTED (see above; also before reading when one work item
// alone does not fit), DATA_LOSS naming the file and offset (a file changed, shrank or grew
// since ReadTree read its header, or during this read), CANCELLED, or the first error a work
// item returned. Nothing is lent after return.
absl::StatusOr<StreamResult> StreamTrees(
    const std::vector<std::shared_ptr<const TreeImage>>& images, std::vector<StreamWork> work,
    const ReadOptions& options, Progress& progress);

}  // namespace ckpt

#endif  // CKPT_CORE_IO_TREE_STREAM_H_
