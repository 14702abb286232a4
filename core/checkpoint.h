// A checkpoint root: config, shard index and validated shards (docs/formats.md §2, §6).
//
// Three layouts are recognised: a single `model.safetensors`; shards listed by
// `model.safetensors.index.json`; and an X4T container B directory (`manifest.json`,
// `tensors/*.safetensors`, `metadata/config.json` and `metadata/*.safetensors`). A checkpoint
// is built on a TreeImage (core/io/tree_image.h): every byte it hands out (config, headers,
// tensor bytes) is a byte of that one read, so nothing can change under it, and the tree walk
// already refused symlinks and special files. The index is cross-checked both ways against
// the shard headers. Immutable after Open, so safe to share between threads.
#ifndef CKPT_CORE_CHECKPOINT_H_
#define CKPT_CORE_CHECKPOINT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/tree_image.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"

namespace ckpt {

enum class CheckpointLayout { kSingleFile, kSharded, kX4TContainer };
std::string_view LayoutName(CheckpointLayout layout);

// A tensor and the shard that holds it.
struct TensorRef {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes() const { return file->Bytes(*info); }
};

class Checkpoint {
 public:
  // An image of one file (TreeImage::single_file) is a single-file checkpoint with an empty
  // config when the file is a .safetensors file. Errors: NOT_FOUND (no recognisable layout, a
  // listed shard missing), INVALID_ARGUMENT (bad config, index or shard header; a single file
  // that is not .safetensors), PERMISSION_DENIED (a map entry that is not a plain file name),
  // DATA_LOSS (a shard whose data does not match its header).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(std::shared_ptr<const TreeImage> image);
  // Reads the tree at `root` first (listed by its layout, core/io/hf_layout.h; ReadTree with
  // `read`; by default every byte is kept and no digest is taken). Also NOT_FOUND when the root
  // is missing, DATA_LOSS when a file changes.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& root,
                                                          const ReadOptions& read = ReadOnly());
  static ReadOptions ReadOnly();

  const std::string& root() const { return image_->root; }  // real path, no trailing slash
  const TreeImage& image() const { return *image_; }
  CheckpointLayout layout() const { return layout_; }
  const nlohmann::json& config() const { return config_; }
  // `text_config` for multimodal configs that nest the text model, else the config itself.
  const nlohmann::json& text_config() const;
  // The X4T container's manifest.json; null for other layouts.
  const nlohmann::json& manifest() const { return manifest_; }

  // Shards in path order; paths relative to root() via RelativePath.
  const std::vector<std::shared_ptr<const SafetensorsFile>>& shards() const { return shards_; }
  std::string RelativePath(const SafetensorsFile& f) const;

  std::optional<TensorRef> Find(std::string_view tensor) const;
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  uint64_t total_tensor_bytes() const;

  // DATA_LOSS naming the first file of the tree modified or replaced since it was read.
  absl::Status CheckUnchanged() const { return image_->CheckUnchanged(); }

 private:
  Checkpoint() = default;
  absl::Status LoadShards(const std::vector<std::string>& relative_paths);
  absl::Status CrossCheckMap(const std::map<std::string, std::string>& weight_map,
                             const std::string& map_file) const;

  std::shared_ptr<const TreeImage> image_;
  CheckpointLayout layout_ = CheckpointLayout::kSingleFile;
  nlohmann::json config_;
  nlohmann::json manifest_;
  std::vector<std::shared_ptr<const SafetensorsFile>> shards_;
  std::vector<std::string> relative_paths_;  // parallel to shards_
  std::map<std::string, TensorRef, std::less<>> tensors_;
  std::optional<uint64_t> declared_total_size_;
};

// realpath(path); NOT_FOUND naming the path and the reason when it cannot be resolved.
absl::StatusOr<std::string> RealPath(const std::string& path);

// Parses a small JSON document (config, index, manifest) with a size cap, in one bounded pass
// (core/text/json_parse.h): nesting over 64 levels, a duplicate key or a byte-order mark is
// INVALID_ARGUMENT; `label` names the document in errors.
absl::StatusOr<nlohmann::json> ParseJsonDocument(std::span<const uint8_t> bytes,
                                                 const std::string& label,
                                                 uint64_t max_bytes = 64ull << 20);
// Reads a standalone JSON file and parses it with ParseJsonDocument.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path,
                                            uint64_t max_bytes = 64ull << 20);

}  // namespace ckpt

#endif  // CKPT_CORE_CHECKPOINT_H_
