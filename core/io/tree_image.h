// One read of a directory tree into memory the process owns (docs/audit-engine.md).
//
// ReadTree opens every listed file once through its parent's io::Directory (openat, no
// symlinks), reads it front to back with pread, and computes from those same bytes its
// SHA-256 (the LFS oid), optional fixed-size range digests (OMS shards mode), the strict
// safetensors header and each tensor's SHA-256. Bytes are kept according to `keep`, so
// everything later built on the image (Checkpoint, the checks, the record's digests) sees
// exactly the bytes that were hashed: a file rewritten on disk afterwards cannot change a
// verdict, and a truncated file is a DATA_LOSS status instead of a SIGBUS.
//
// A file whose identity (inode, size, mtime, ctime) differs after its read from what fstat
// said when it was opened is DATA_LOSS; CheckUnchanged() re-stats every name at the end of an
// audit, which also catches a file renamed over one that was read. Kept bytes are bounded by
// `memory_window`: small files kept whole that do not fit are RESOURCE_EXHAUSTED before anything
// is read, and a safetensors header is counted when its 8-byte length has been read, before it
// is allocated (RESOURCE_EXHAUSTED naming the file when it does not fit).
// Immutable once built; safe to share between threads.
#ifndef CKPT_CORE_IO_TREE_IMAGE_H_
#define CKPT_CORE_IO_TREE_IMAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/git_blob_sha1.h"
#include "core/io/file_system.h"
#include "core/io/tree_walk.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "core/sha256.h"

namespace ckpt {

inline constexpr uint64_t kDefaultMemoryWindow = 1536ull << 20;

struct ReadOptions {
  enum class Keep {
    kNothing,     // digests only (fingerprint)
    kMetadata,    // safetensors headers and small non-safetensors files (inspect)
    kEverything,  // whole files (every check on tensor bytes of a tree read whole)
    // Audits: safetensors headers, small files and X4T sidecars now; the rest of every other
    // *.safetensors file is left unread (ImageFile::stream_from) for StreamTrees
    // (core/io/tree_stream.h), which reads it once in a bounded window.
    kStreamTensorData,
  };
  Keep keep = Keep::kEverything;
  uint64_t memory_window = kDefaultMemoryWindow;
  // Bytes of the window already kept by another read sharing it (a pair audit's first tree).
  uint64_t window_in_use = 0;
  unsigned threads = 0;  // files read at once; 0: DefaultThreads()
  bool file_digests = true;
  bool tensor_digests = true;
  uint64_t range_size = 0;  // > 0: a digest of every [k * range_size, (k+1) * range_size)
  // StreamTrees only: each file's tensors are read for the work at storage speed, and the
  // file's digests are taken behind those reads by a second cursor, from the page cache, which
  // checks each tensor against the SHA-256 of the bytes the work read (core/io/tree_stream.h).
  bool hash_behind = false;
  uint64_t max_small_file = 64ull << 20;  // kMetadata keeps non-safetensors files up to this
  SafetensorsLimits limits;
};

struct ImageFile {
  std::string path;  // POSIX, relative to the root, raw bytes
  std::string name;  // EncodeName(path): what records and lookups use
  std::shared_ptr<const io::Directory> parent;
  std::string leaf;  // last component, raw
  std::string target;  // TreeFile::target: the real path read when the path is a link
  bool wants_git_blob_id = false;     // TreeFile::git_blob_id
  std::optional<GitObjectId> git_blob_id;  // when wanted and the whole file was read
  io::FileIdentity identity;  // fstat when opened; unchanged after the read
  std::optional<Digest> sha256;
  std::vector<Digest> range_digests;  // ReadOptions::range_size
  // The kept bytes from offset 0: the whole file, a header prefix, or null.
  std::shared_ptr<const std::vector<uint8_t>> content;
  // *.safetensors only: the parsed header, or why it did not parse.
  std::shared_ptr<const SafetensorsFile> safetensors;
  absl::Status header_status;
  std::vector<Digest> tensor_digests;  // parallel to safetensors->tensors()
  uint64_t parsed_bytes = 0;  // about what `safetensors` holds on the heap besides `content`
  // Keep::kStreamTensorData: the file was read up to here (its header, kept in `content`);
  // the digests are taken when StreamTrees reads the rest.
  std::optional<uint64_t> stream_from;

  uint64_t size() const { return identity.size; }
  bool complete() const { return content && content->size() == identity.size; }
};

class TreeImage {
 public:
  std::string root;  // the real path of the root directory as opened
  std::shared_ptr<const io::Directory> root_dir;
  std::string single_file;  // a tree of one file (TreeListing::single_file): its name in root
  std::vector<std::string> directories;  // PosixPathLess order
  std::vector<ImageFile> files;          // PosixPathLess order of `name`
  std::vector<io::LinkHop> links;        // links followed by the listing
  uint64_t bytes_read = 0;               // every byte pread from storage
  uint64_t kept_bytes = 0;  // kept contents and parsed headers: what counts against the window

  // What was audited: `root`, or root/single_file for a tree of one file.
  std::string RootPath() const;
  // By recorded name (equal to the path for every valid UTF-8 path).
  const ImageFile* Find(std::string_view name) const;
  bool IsDirectory(std::string_view path) const;
  // The whole kept content of a file; NOT_FOUND / FAILED_PRECONDITION (not kept) naming it.
  absl::StatusOr<std::span<const uint8_t>> Content(std::string_view path) const;
  // DATA_LOSS naming the first file whose name no longer leads to the inode, size, mtime and
  // ctime that were read (rewritten, truncated, renamed over or removed since), or whose link
  // (when it was reached through one) now holds another text.
  absl::Status CheckUnchanged() const;
};

// Errors: INVALID_ARGUMENT (bad options), RESOURCE_EXHAUSTED (small files or a header over the
// memory window, beside `window_in_use`),
// NOT_FOUND / PERMISSION_DENIED (a file cannot be opened), DATA_LOSS (a file changed,
// shrank or could not be read; the message names the file and the offset). A safetensors
// header that does not parse is not an error here: it is kept in header_status.
absl::StatusOr<std::shared_ptr<const TreeImage>> ReadTree(TreeListing listing,
                                                          const ReadOptions& options,
                                                          Progress& progress);

// Lists and reads `root` on the real file system.
absl::StatusOr<std::shared_ptr<const TreeImage>> ReadTree(const std::string& root,
                                                          const ReadOptions& options,
                                                          const TreeWalkOptions& walk = {});

}  // namespace ckpt

#endif  // CKPT_CORE_IO_TREE_IMAGE_H_
