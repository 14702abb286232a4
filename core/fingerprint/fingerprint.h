// Fingerprints of a directory tree: SHA-256 of every file and of every safetensors tensor, and
// the OpenSSF model-signing manifest ROOT over them (docs/oms-manifest.md).
//
// Usage:
//   absl::StatusOr<Fingerprint> fp = FingerprintTree(root, {}, NoProgress());
//   fp->files[i].sha256      // == `sha256sum` of the file == its Hugging Face LFS oid
//   fp->manifest.RootHex()   // the model_signing subject digest
//
// Every digest comes from the one read of each file (core/io/tree_image.h): files are read in
// parallel, each front to back once, and every digest of a file is taken from the same bytes.
// A file changed during the run is DATA_LOSS, not a digest of bytes no longer on disk.
#ifndef CKPT_CORE_FINGERPRINT_FINGERPRINT_H_
#define CKPT_CORE_FINGERPRINT_FINGERPRINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/fingerprint/oms_manifest.h"
#include "core/io/hf_layout.h"
#include "core/io/tree_image.h"
#include "core/io/tree_walk.h"
#include "core/progress.h"
#include "core/sha256.h"

namespace ckpt {

// Part `index` of `count` of a tree split across workers (core/fingerprint/partition.h).
struct PartSpec {
  unsigned index = 0;
  unsigned count = 1;
};

// The most parts one tree is split into: more than any cluster runs one audit on, few enough
// that the split's bookkeeping (a slot per part) stays small whatever a caller asks for.
inline constexpr unsigned kMaxParts = 4096;

// INVALID_ARGUMENT naming `field` unless 0 <= index < count <= kMaxParts, and, given the number
// of `groups` the split shares out (files, or an audit's file groups), count <= groups (a
// part beyond them would read nothing); a split into one part always passes.
absl::Status CheckPartSpec(const PartSpec& spec, const std::string& field,
                           size_t groups = SIZE_MAX);

struct FingerprintOptions {
  unsigned threads = 0;  // 0: DefaultThreads()
  OmsMode manifest_mode = OmsMode::kFiles;
  uint64_t shard_size = kDefaultOmsShardSize;  // shards mode
  // Whole-file SHA-256 (the LFS oid). Required in files mode; in shards mode turning it off
  // leaves only parallel range digests, the fastest variant for one very large file.
  bool file_digests = true;
  // SHA-256 of each tensor's bytes in every `*.safetensors` file (which must then parse).
  bool tensor_digests = true;
  TreeWalkOptions walk;
  // Links in generic trees (hub cache snapshots are detected and followed under their own
  // rules; a local-dir download's .cache/huggingface/ is left out: docs/hf-layouts.md).
  LinkOptions links;
  // With count > 1, only this part's files are hashed (files mode only); the manifest then
  // covers just those files, and MergeFingerprintParts builds the whole tree's.
  PartSpec part;
};

// Names are recorded names (TreeFile::name, EncodeName of tensor names): valid UTF-8.
struct FileFingerprint {
  std::string path;  // POSIX, relative to the root
  uint64_t size = 0;
  std::optional<Digest> sha256;  // absent only when file_digests is off
  size_t tensor_count = 0;       // safetensors files with tensor digests
};

struct TensorFingerprint {
  std::string file;  // FileFingerprint::path
  std::string tensor;
  uint64_t bytes = 0;
  Digest sha256{};
};

struct Fingerprint {
  std::string root;                       // realpath (raw bytes)
  std::vector<FileFingerprint> files;     // PosixPathLess order
  std::vector<TensorFingerprint> tensors; // by file, then by offset in the file
  OmsManifest manifest;
  uint64_t hashed_bytes = 0;  // every byte SHA-256 consumed (files + tensors + shards)
  LayoutInfo layout;          // FingerprintTree only
};

// Errors: NOT_FOUND (root), INVALID_ARGUMENT (symlink or special file in the tree, a
// malformed safetensors header, bad options), DATA_LOSS (a file changed while hashed).
absl::StatusOr<Fingerprint> FingerprintTree(const std::string& root,
                                            const FingerprintOptions& options,
                                            Progress& progress);

// The fingerprint of a tree already read with file digests (files mode) and tensor digests.
// A safetensors file whose header did not parse has no tensor digests.
Fingerprint FingerprintOf(const TreeImage& image, const std::vector<std::string>& ignore_paths);

}  // namespace ckpt

#endif  // CKPT_CORE_FINGERPRINT_FINGERPRINT_H_
