// A checkpoint root: config, shard index and validated shards (docs/formats.md §2, §6).
//
// Three layouts are recognised: a single `model.safetensors`; shards listed by
// `model.safetensors.index.json`; and an X4T container B directory (`manifest.json`,
// `tensors/*.safetensors`, `metadata/config.json` and `metadata/*.safetensors`). Every file is
// resolved with realpath and must stay inside the root. The index is cross-checked both ways
// against the shard headers. Immutable after Open, so safe to share between threads.
#ifndef CKPT_CORE_CHECKPOINT_H_
#define CKPT_CORE_CHECKPOINT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
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
  // Errors: NOT_FOUND (no root or no recognisable layout), INVALID_ARGUMENT (bad config, index
  // or shard header), PERMISSION_DENIED (a path leaves the root), DATA_LOSS (truncated shard).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& root,
                                                          const SafetensorsLimits& limits = {});

  const std::string& root() const { return root_; }  // realpath, no trailing slash
  CheckpointLayout layout() const { return layout_; }
  const nlohmann::json& config() const { return config_; }
  // `text_config` for multimodal configs that nest the text model, else the config itself.
  const nlohmann::json& text_config() const;
  // The X4T container's manifest.json; null for other layouts.
  const nlohmann::json& manifest() const { return manifest_; }

  // Shards in path order; paths relative to root() via RelativePath.
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  std::string RelativePath(const SafetensorsFile& f) const;

  std::optional<TensorRef> Find(std::string_view tensor) const;
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  uint64_t total_tensor_bytes() const;

  // DATA_LOSS naming the first shard modified or replaced since Open.
  absl::Status CheckUnchanged() const;

 private:
  Checkpoint() = default;
  absl::Status LoadShards(const std::vector<std::string>& relative_paths,
                          const SafetensorsLimits& limits);
  absl::Status CrossCheckMap(const std::map<std::string, std::string>& weight_map,
                             const std::string& map_file) const;

  std::string root_;
  CheckpointLayout layout_ = CheckpointLayout::kSingleFile;
  nlohmann::json config_;
  nlohmann::json manifest_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<std::string> relative_paths_;  // parallel to shards_
  std::map<std::string, TensorRef, std::less<>> tensors_;
  std::optional<uint64_t> declared_total_size_;
};

// realpath(path); NOT_FOUND naming the path and the reason when it cannot be resolved.
absl::StatusOr<std::string> RealPath(const std::string& path);

// realpath(root + "/" + relative), which must be inside `root` (itself a realpath).
// PERMISSION_DENIED when a symlink or ".." leaves the root.
absl::StatusOr<std::string> ResolveInsideRoot(const std::string& root,
                                              const std::string& relative);

// Reads a whole small JSON file (config, index, manifest) with a size cap, in one bounded pass
// (core/text/json_parse.h): nesting over 64 levels, a duplicate key or a byte-order mark is
// INVALID_ARGUMENT naming the file.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path,
                                            uint64_t max_bytes = 64ull << 20);

}  // namespace ckpt

#endif  // CKPT_CORE_CHECKPOINT_H_
