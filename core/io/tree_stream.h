// The second half of an audit's one read (docs/audit-engine.md, "Memory"): the tensor data
// that ReadTree left unread under Keep::kStreamTensorData, read once, in a bounded window.
//
// Every deferred file is hashed front to back by its cursor, in chunks (the file SHA-256
// continues from the header ReadTree kept). A tensor is kept only while some piece of work
// still needs it: the caller lists work items (a check on a few tensors, e.g. one module of the
// derived checkpoint with its source partner); a tensor is read straight into a buffer of its
// own, lent to its SafetensorsFile (so Checkpoint and TensorRef readers see it), and an item
// runs on one of the stream's threads as soon as all its tensors are in.
//
// Read-ahead: in each file, a work item's tensors that lie beyond its largest tensor there (not
// adjacent to it) and are together smaller than it (an NVFP4 module's scales when the shard
// stores every packed weight before every scale) are read ahead, with pread at their offset,
// when the cursor reaches that largest tensor; the cursor later hashes them from their buffer
// instead of reading them again. Such a buffer is freed when every item that needs it has run
// AND the cursor has passed it. Each byte is read from storage once, and the digests are of
// the bytes in memory, the ones the work read.
//
// Hashing behind the reads (ReadOptions::hash_behind; docs/audit-engine.md): the cursor reads
// only the tensors work needs, without hashing, at storage speed; a second, hashing cursor
// follows it (from the page cache), takes the file's digests, feeds the sinks and does the
// end-of-file checks. Each tensor's buffer is hashed before the first work item on it runs,
// and must equal the hashing cursor's digest of that range, else DATA_LOSS.
//
// Admission: work is admitted in the order its tensors lie in the files (the first input image
// holding any of them, then the file, then how far its cursor must go there; list order breaks
// ties), and a tensor gets memory only once admitted. Admitting an item counts what it and the
// items before it need in memory: their tensors, and every needed tensor the cursors must pass
// to reach them; an item is admitted only when that fits in ReadOptions::memory_window beside
// what is held. So kept bytes (the images' kept files and headers plus the tensors held) never
// exceed the window, and whatever is admitted can always complete. Where the files' tensor
// order would make the cursors hold more than the window (partners far apart), a replay of
// admission on the headers picks tensors to read twice instead (docs/audit-engine.md, "Any
// tensor order"), each second read checked against the hash of the first and counted in
// StreamResult. When the next item does not fit even so and nothing in flight can free memory,
// the stream stops with RESOURCE_EXHAUSTED naming the window, what is held and the item, bytes
// and tensor it could not take; it never grows past the window. Whether it stops does not
// depend on timing. Between chunks it polls Progress::Cancelled (CANCELLED).
#ifndef CKPT_CORE_IO_TREE_STREAM_H_
#define CKPT_CORE_IO_TREE_STREAM_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/tree_image.h"
#include "core/progress.h"
#include "core/safetensors.h"

namespace ckpt {

// The smallest read chunk (one per thread; the window / 16, between this and 8 MiB): a memory
// window below it is refused (services/cli ParseByteSize).
inline constexpr uint64_t kMinReadChunk = 64ull << 10;

using StreamTensors = std::vector<std::pair<const SafetensorsFile*, const TensorInfo*>>;

// Work on tensor bytes: `run` is called once, on a stream thread, when every listed tensor's
// bytes are available through its SafetensorsFile (tensors of files kept whole always are).
//
// Dependent work (docs/audit-engine.md, "Work that depends on other work"), e.g. the block
// forward's experts, which are needed only if the router chose them:
//   after            items (indices into StreamTrees' list, each before this one) that must have
//                    run (or been dropped) before this one runs; its tensors may be held
//                    meanwhile, and are counted in the window as usual.
//   wanted           when set, asked once (under the stream's lock: cheap, no I/O) when every
//                    item of `after` has run; false drops the item: it never runs and its
//                    tensors are hashed as they stream past unless other work needs them. Such
//                    an item is admitted (gets memory) only after the answer, so a dropped item
//                    never holds memory.
//   read_ahead_from  in each file holding one of these tensors, this item's tensors that lie
//                    beyond the first of them are read ahead (pread into their buffers, hashed
//                    later from there) once the file's cursor reaches it: a layer's router,
//                    stored after its experts, is read when the cursor reaches the experts.
struct StreamWork {
  std::string label;  // names the item in messages
  StreamTensors tensors;
  std::function<absl::Status()> run;
  std::vector<size_t> after = {};
  std::function<bool()> wanted = {};
  StreamTensors read_ahead_from = {};
};

// Bytes of a file that no work item holds, handed over as the file's cursor hashes them (a copy
// written straight through, never counted against the window): `consume` runs on a stream
// thread, outside the stream's lock, once per piece of [begin, end) in file order, with the
// piece's offset from `begin`; the bytes are valid during the call only. Sinks of one file must
// not overlap.
struct StreamSink {
  const SafetensorsFile* file = nullptr;
  uint64_t begin = 0, end = 0;  // absolute offsets in the file
  std::function<absl::Status(uint64_t offset, std::span<const uint8_t> bytes)> consume;
};

// One tensor's bytes read from a skimmed file (below), and their SHA-256.
struct RangeDigest {
  size_t image = 0;  // index into StreamTrees' input
  std::string file;  // ImageFile::name
  std::string tensor;
  uint64_t begin = 0, end = 0;  // absolute offsets in the file
  Digest sha256{};
};

// Files (by input image and ImageFile) a stream does not hash: one part of an audit split
// across machines reads only the tensors its own work needs from the files another part hashes
// (docs/audit-parts.md). A skimmed file's cursor skips every byte no work item needs: nothing is
// read ahead of it or behind it, it gets no file or tensor digests, and each tensor read there
// gives a RangeDigest instead. Sinks on a skimmed file are INVALID_ARGUMENT.
using SkimFiles = std::function<bool(size_t image, const ImageFile& file)>;

struct StreamResult {
  // The input images with every deferred file completed (digests set, except for skimmed
  // files; stream_from cleared; bytes_read including this stream).
  std::vector<std::shared_ptr<const TreeImage>> images;
  std::vector<RangeDigest> ranges;  // the tensors read from skimmed files, by file and offset
  uint64_t bytes_read = 0;          // from storage by this stream, re-reads included
  uint64_t peak_kept_bytes = 0;  // kept files and headers plus tensors held, at most the window
  // Tensors hashed by the cursor without being kept and read again for their work (docs/
  // audit-engine.md, "Reading behind the cursor", "Any tensor order"), and their bytes.
  uint64_t reread_tensors = 0, reread_bytes = 0;
};

// `images` were read by ReadTree with Keep::kStreamTensorData and `options` (digests, window,
// threads). Errors: RESOURCE_EXHAUSTED (see above; also before reading when one work item
// alone does not fit), DATA_LOSS naming the file and offset (a file changed, shrank or grew
// since ReadTree read its header, or during this read), CANCELLED, or the first error a work
// item or sink returned; INVALID_ARGUMENT for a sink on a file that is not streamed, or when an
// `after` names no earlier item. Nothing is lent after return.
absl::StatusOr<StreamResult> StreamTrees(
    const std::vector<std::shared_ptr<const TreeImage>>& images, std::vector<StreamWork> work,
    const ReadOptions& options, Progress& progress, std::vector<StreamSink> sinks = {},
    const SkimFiles& skim = {});

}  // namespace ckpt

#endif  // CKPT_CORE_IO_TREE_STREAM_H_
