#include "core/checkpoint.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/io/hf_layout.h"
#include "core/text/json_parse.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

using nlohmann::json;

// A weight_map value must name a file directly inside the root.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const json& j,
                                                                 const std::string& file,
                                                                 const std::string& field) {
  if (!j.is_object() || !j.contains(field) || !j.at(field).is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": missing or non-object \"", field, "\""));
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : j.at(field).items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": ", field, " value for tensor '", tensor, "' is not a string"));
    }
    out.emplace(tensor, shard.get<std::string>());
  }
  return out;
}

absl::StatusOr<json> ReadJson(const TreeImage& image, const std::string& relative) {
  absl::StatusOr<std::span<const uint8_t>> bytes = image.Content(relative);
  if (!bytes.ok()) return bytes.status();
  return ParseJsonDocument(*bytes, absl::StrCat(image.root, "/", relative));
}

absl::StatusOr<json> ReadConfig(const TreeImage& image, const std::string& relative) {
  const std::string path = absl::StrCat(image.root, "/", relative);
  if (image.Find(relative) == nullptr) {  // the commonest wrong root: say so, not "no such file"
    return absl::NotFoundError(absl::StrCat(
        image.root, " has no ", relative, ": a checkpoint folder holds its config.json beside "
        "its safetensors files (is this the checkpoint's folder?)"));
  }
  absl::StatusOr<json> config = ReadJson(image, relative);
  if (!config.ok()) return config.status();
  if (!config->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": config is not a JSON object"));
  }
  if (config->contains("text_config") && config->contains("quantization_config")) {
    const json& text = config->at("text_config");
    if (text.is_object() && text.contains("quantization_config") &&
        text.at("quantization_config") != config->at("quantization_config")) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": text_config.quantization_config disagrees with quantization_config"));
    }
  }
  return config;
}

}  // namespace

std::string_view LayoutName(CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kSingleFile: return "single-file";
    case CheckpointLayout::kSharded: return "sharded";
    case CheckpointLayout::kX4TContainer: return "x4t-container";
  }
  return "?";
}

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot resolve: ", std::strerror(errno)));
  }
  return std::string(buf);
}

absl::StatusOr<json> ReadJsonFile(const std::string& path, uint64_t max_bytes) {
  const size_t slash = path.rfind('/');
  absl::StatusOr<std::unique_ptr<io::Directory>> dir =
      io::RealFileSystem().OpenRoot(slash == std::string::npos ? "." : path.substr(0, slash + 1));
  if (!dir.ok()) return dir.status();
  absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> file =
      (*dir)->OpenFile(slash == std::string::npos ? path : path.substr(slash + 1));
  if (!file.ok()) return file.status();
  absl::StatusOr<io::FileIdentity> id = (*file)->Identity();
  if (!id.ok()) return id.status();
  if (id->size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", id->size, " bytes is over the ",
                                                   max_bytes, "-byte limit for JSON files"));
  }
  std::vector<uint8_t> bytes(id->size);
  if (absl::Status s = io::ReadExactly(**file, 0, bytes, path); !s.ok()) return s;
  return ParseJsonDocument(bytes, path, max_bytes);
}

absl::StatusOr<json> ParseJsonDocument(std::span<const uint8_t> bytes, const std::string& path,
                                       uint64_t max_bytes) {
  if (bytes.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes.size(),
                                                   " bytes is over the ", max_bytes,
                                                   "-byte limit for JSON files"));
  }
  // nlohmann compares, copies and dumps recursively: a config nested 200,000 deep (an input
  // run through fuzz_checkpoint_open) overflowed the stack in the quantization_config
  // comparison. Real configs nest about 6 levels.
  JsonLimits limits;
  limits.max_depth = 64;
  return ParseBoundedJson(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path, limits);
}

ReadOptions Checkpoint::ReadOnly() {
  ReadOptions o;
  o.file_digests = false;
  o.tensor_digests = false;
  return o;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& root,
                                                             const ReadOptions& read) {
  // Hub cache snapshots and local-dir downloads are listed by their rules (docs/hf-layouts.md).
  absl::StatusOr<LayoutListing> listing = ListLayout(root);
  if (!listing.ok()) return listing.status();
  absl::StatusOr<std::shared_ptr<const TreeImage>> image =
      ReadTree(std::move(listing->listing), read, NoProgress());
  if (!image.ok()) return image.status();
  return Open(*std::move(image));
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    std::shared_ptr<const TreeImage> image) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->image_ = std::move(image);
  const TreeImage& img = *ckpt->image_;
  const std::string& r = img.root;

  std::vector<std::string> shard_paths;
  std::map<std::string, std::string> weight_map;
  std::string map_file;
  if (!img.single_file.empty()) {
    // One file given as the root (docs/audit-engine.md "One file"): the checkpoint is that file
    // alone; nothing beside it is read, so it declares no config.
    if (!absl::EndsWith(img.single_file, ".safetensors")) {
      return absl::InvalidArgumentError(
          absl::StrCat(EncodeName(img.RootPath()),
                       ": a file is a checkpoint only when it is a .safetensors file"));
    }
    ckpt->layout_ = CheckpointLayout::kSingleFile;
    ckpt->config_ = json::object();
    shard_paths.push_back(img.single_file);
  } else if (img.Find("manifest.json") != nullptr && img.IsDirectory("tensors")) {
    ckpt->layout_ = CheckpointLayout::kX4TContainer;
    const std::string mpath = r + "/manifest.json";
    absl::StatusOr<json> manifest = ReadJson(img, "manifest.json");
    if (!manifest.ok()) return manifest.status();
    if (!manifest->is_object() || !manifest->contains("shards") ||
        !manifest->at("shards").is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(mpath, ": missing \"shards\" array"));
    }
    ckpt->manifest_ = *manifest;
    for (const json& s : manifest->at("shards")) {
      if (!s.is_object() || !s.contains("file") || !s.at("file").is_string() ||
          !IsPlainFileName(s.at("file").get_ref<const std::string&>())) {
        return absl::InvalidArgumentError(
            absl::StrCat(mpath, ": shard entry is not {\"file\": <plain file name>}"));
      }
      shard_paths.push_back("tensors/" + s.at("file").get<std::string>());
    }
    map_file = r + "/build-contract.json";
    absl::StatusOr<json> contract = ReadJson(img, "build-contract.json");
    if (!contract.ok()) return contract.status();
    auto wm = ReadWeightMap(*contract, map_file, "source_names");
    if (!wm.ok()) return wm.status();
    for (auto& [tensor, file] : *wm) weight_map.emplace(tensor, "tensors/" + file);
    std::vector<std::string> meta;
    for (const ImageFile& f : img.files) {
      if (absl::StartsWith(f.name, "metadata/") && f.name.find('/', 9) == std::string::npos &&
          absl::EndsWith(f.name, ".safetensors")) {
        meta.push_back(f.name);
      }
    }
    std::sort(meta.begin(), meta.end());
    shard_paths.insert(shard_paths.end(), meta.begin(), meta.end());
    absl::StatusOr<json> config = ReadConfig(img, "metadata/config.json");
    if (!config.ok()) return config.status();
    ckpt->config_ = *std::move(config);
  } else {
    absl::StatusOr<json> config = ReadConfig(img, "config.json");
    if (!config.ok()) return config.status();
    ckpt->config_ = *std::move(config);
    if (img.Find("model.safetensors.index.json") != nullptr) {
      ckpt->layout_ = CheckpointLayout::kSharded;
      map_file = r + "/model.safetensors.index.json";
      absl::StatusOr<json> index = ReadJson(img, "model.safetensors.index.json");
      if (!index.ok()) return index.status();
      auto wm = ReadWeightMap(*index, map_file, "weight_map");
      if (!wm.ok()) return wm.status();
      weight_map = *std::move(wm);
      std::set<std::string> files;
      for (const auto& [tensor, file] : weight_map) {
        if (!IsPlainFileName(file)) {
          return absl::PermissionDeniedError(absl::StrCat(
              map_file, ": tensor '", tensor, "' maps to '", file,
              "', which is not a plain file name inside the root"));
        }
        files.insert(file);
      }
      shard_paths.assign(files.begin(), files.end());
      if (index->contains("metadata") && index->at("metadata").contains("total_size")) {
        const json& ts = index->at("metadata").at("total_size");
        if (!ts.is_number_unsigned()) {
          return absl::InvalidArgumentError(
              absl::StrCat(map_file, ": metadata.total_size is not a non-negative integer"));
        }
        ckpt->declared_total_size_ = ts.get<uint64_t>();
      }
    } else if (img.Find("model.safetensors") != nullptr) {
      ckpt->layout_ = CheckpointLayout::kSingleFile;
      shard_paths.push_back("model.safetensors");
    } else {
      return absl::NotFoundError(absl::StrCat(
          r, ": no model.safetensors, model.safetensors.index.json or X4T manifest.json"));
    }
  }
  if (absl::Status s = ckpt->LoadShards(shard_paths); !s.ok()) return s;
  if (!map_file.empty()) {
    if (absl::Status s = ckpt->CrossCheckMap(weight_map, map_file); !s.ok()) return s;
  }
  if (ckpt->declared_total_size_ &&
      *ckpt->declared_total_size_ != ckpt->total_tensor_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        map_file, ": metadata.total_size is ", *ckpt->declared_total_size_,
        " but the shards' tensors hold ", ckpt->total_tensor_bytes(), " bytes"));
  }
  return ckpt;
}

absl::Status Checkpoint::LoadShards(const std::vector<std::string>& relative_paths) {
  for (const std::string& rel : relative_paths) {
    const ImageFile* f = image_->Find(rel);
    if (f == nullptr) {
      return absl::NotFoundError(absl::StrCat(root(), "/", rel, ": no such file in the root"));
    }
    if (!f->header_status.ok()) return f->header_status;
    if (f->safetensors == nullptr) {
      return absl::InternalError(absl::StrCat(root(), "/", rel, ": header was not read"));
    }
    for (const TensorInfo& t : f->safetensors->tensors()) {
      auto [it, inserted] = tensors_.emplace(t.name, TensorRef{f->safetensors.get(), &t});
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(root(), ": tensor '", t.name, "' is in two shards: ",
                         it->second.file->path(), " and ", f->safetensors->path()));
      }
    }
    relative_paths_.push_back(rel);
    shards_.push_back(f->safetensors);
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::CrossCheckMap(const std::map<std::string, std::string>& weight_map,
                                       const std::string& map_file) const {
  for (const auto& [tensor, rel] : weight_map) {
    auto it = tensors_.find(tensor);
    if (it == tensors_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          map_file, ": tensor '", tensor, "' is listed in ", rel, " but no shard holds it"));
    }
    std::string actual = RelativePath(*it->second.file);
    if (actual != rel) {
      return absl::InvalidArgumentError(absl::StrCat(map_file, ": tensor '", tensor,
                                                     "' is listed in ", rel,
                                                     " but stored in ", actual));
    }
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    bool mapped_shard = std::any_of(weight_map.begin(), weight_map.end(),
                                    [&](const auto& kv) { return kv.second == relative_paths_[i]; });
    if (!mapped_shard) continue;  // X4T metadata/ shards are not in the contract
    for (const TensorInfo& t : shards_[i]->tensors()) {
      if (!weight_map.contains(t.name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            shards_[i]->path(), ": tensor '", t.name, "' is missing from ", map_file));
      }
    }
  }
  return absl::OkStatus();
}

const json& Checkpoint::text_config() const {
  auto it = config_.find("text_config");
  return it != config_.end() && it->is_object() ? *it : config_;
}

std::string Checkpoint::RelativePath(const SafetensorsFile& f) const {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i].get() == &f) return relative_paths_[i];
  }
  return f.path();
}

std::optional<TensorRef> Checkpoint::Find(std::string_view tensor) const {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, ref] : tensors_) names.push_back(name);
  return names;
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, ref] : tensors_) total += ref.info->num_bytes();
  return total;
}

}  // namespace ckpt
