#include "core/fingerprint/fingerprint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "core/fingerprint/partition.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

absl::Status CheckOptions(const FingerprintOptions& o) {
  if (o.manifest_mode == OmsMode::kFiles && !o.file_digests) {
    return absl::InvalidArgumentError("fingerprint: files-mode manifest needs file digests");
  }
  if (absl::Status s = CheckPartSpec(o.part, "--part"); !s.ok()) return s;
  if (o.part.count > 1 && o.manifest_mode != OmsMode::kFiles) {
    return absl::InvalidArgumentError("fingerprint: parts are supported in files mode only");
  }
  if (o.manifest_mode == OmsMode::kShards && o.shard_size == 0) {
    return absl::InvalidArgumentError("fingerprint: shard size must be positive");
  }
  return absl::OkStatus();
}

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Files, tensors and hashed-byte count of an image; manifest resources in files mode.
Fingerprint Collect(const TreeImage& image, const FingerprintOptions& o,
                    std::vector<OmsResource>* resources) {
  Fingerprint fp;
  fp.root = image.RootPath();
  for (const ImageFile& f : image.files) {
    const size_t tensors = f.tensor_digests.size();
    fp.files.push_back({f.name, f.size(), f.sha256, tensors});
    if (f.sha256) fp.hashed_bytes += f.size();
    if (o.manifest_mode == OmsMode::kShards) {
      fp.hashed_bytes += f.size();
      auto ranges = OmsShardRanges(f.size(), o.shard_size);
      for (size_t k = 0; k < ranges.size() && k < f.range_digests.size(); ++k) {
        resources->push_back({f.name, ranges[k].first, ranges[k].second, f.range_digests[k]});
      }
    } else if (f.sha256) {
      resources->push_back({f.name, 0, f.size(), *f.sha256});
    }
    for (size_t k = 0; k < tensors; ++k) {
      const TensorInfo& t = f.safetensors->tensors()[k];
      fp.tensors.push_back({f.name, EncodeName(t.name), t.num_bytes(), f.tensor_digests[k]});
      fp.hashed_bytes += t.num_bytes();
    }
  }
  return fp;
}

}  // namespace

absl::Status CheckPartSpec(const PartSpec& spec, const std::string& field, size_t groups) {
  const size_t most = spec.count == 1 ? 1 : std::min<size_t>(kMaxParts, groups);
  if (spec.count == 0 || spec.index >= spec.count || spec.count > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " ", spec.index, "/", spec.count, ": expected I/N with 0 <= I < N <= ", most,
        groups < kMaxParts && spec.count != 1
            ? absl::StrCat(" (the tree has ", groups, " file groups to share out)")
            : absl::StrCat(" (at most ", kMaxParts, " parts)")));
  }
  return absl::OkStatus();
}

Fingerprint FingerprintOf(const TreeImage& image, const std::vector<std::string>& ignore_paths) {
  FingerprintOptions o;
  std::vector<OmsResource> resources;
  Fingerprint fp = Collect(image, o, &resources);
  fp.manifest = BuildOmsManifest(OmsMode::kFiles, o.shard_size, EncodeName(BaseName(fp.root)),
                                 ignore_paths, std::move(resources));
  fp.manifest.allow_symlinks = !image.links.empty();
  return fp;
}

absl::StatusOr<Fingerprint> FingerprintTree(const std::string& root,
                                            const FingerprintOptions& options,
                                            Progress& progress) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  absl::StatusOr<LayoutListing> layout = ListLayout(root, options.links, options.walk);
  if (!layout.ok()) return layout.status();
  TreeListing* tree = &layout->listing;
  if (absl::Status s = CheckPartSpec(options.part, "--part", tree->files.size()); !s.ok()) {
    return s;
  }
  if (options.part.count > 1) tree->files = FilesOfPart(tree->files, options.part);
  if (options.manifest_mode == OmsMode::kShards) {
    uint64_t shards = 0;
    for (const TreeFile& f : tree->files) {
      shards += f.size == 0 ? 1 : (f.size - 1) / options.shard_size + 1;
    }
    if (shards > kMaxOmsShards) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shard-size ", options.shard_size, " cuts ", EncodeName(tree->root_dir->label()),
          " into ", shards, " shards, more than ", kMaxOmsShards,
          " (a digest and a name each); choose a larger --shard-size"));
    }
  }
  ReadOptions read;
  read.keep = ReadOptions::Keep::kNothing;
  read.threads = options.threads;
  read.file_digests = options.file_digests;
  read.tensor_digests = options.tensor_digests;
  read.range_size = options.manifest_mode == OmsMode::kShards ? options.shard_size : 0;
  absl::StatusOr<std::shared_ptr<const TreeImage>> image =
      ReadTree(std::move(*tree), read, progress);
  if (!image.ok()) return image.status();
  // Every name must still lead to what was read: the digests describe the tree as it is now.
  if (absl::Status s = (*image)->CheckUnchanged(); !s.ok()) return s;
  if (options.tensor_digests) {
    for (const ImageFile& f : (*image)->files) {
      if (!f.header_status.ok()) return f.header_status;
    }
  }
  std::vector<OmsResource> resources;
  Fingerprint fp = Collect(**image, options, &resources);
  fp.manifest = BuildOmsManifest(options.manifest_mode, options.shard_size,
                                 EncodeName(BaseName(fp.root)), layout->walk.ignore_paths,
                                 std::move(resources));
  fp.manifest.allow_symlinks = !(*image)->links.empty();
  fp.layout = std::move(layout->layout);
  return fp;
}

}  // namespace ckpt
