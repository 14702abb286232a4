// An OpenSSF model-signing (sigstore model-transparency) manifest: docs/oms-manifest.md.
//
// Two serializations: `files` (one resource per file, named by its path, digest = SHA-256 of
// the file) and `shards` (each file cut into [k*S, min((k+1)*S, size)) ranges, resources named
// "path:start:end", each the SHA-256 of that range; an empty file has no shard, as in
// model_signing). Resources are sorted by (path, start, end) with PosixPathLess, and the ROOT
// is SHA-256 over their raw 32-byte digests concatenated in that order: the subject digest of
// the model_signing v1.0 in-toto statement.
#ifndef CKPT_CORE_FINGERPRINT_OMS_MANIFEST_H_
#define CKPT_CORE_FINGERPRINT_OMS_MANIFEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/sha256.h"
#include "nlohmann/json.hpp"

namespace ckpt {

enum class OmsMode { kFiles, kShards };

struct OmsResource {
  std::string path;  // POSIX, relative to the model root
  uint64_t start = 0;
  uint64_t end = 0;  // files mode: [0, size)
  Digest digest{};
};

struct OmsManifest {
  OmsMode mode = OmsMode::kFiles;
  uint64_t shard_size = 0;  // shards mode only
  std::string model_name;   // the root directory's name, the statement's subject name
  std::vector<std::string> ignore_paths;
  bool allow_symlinks = false;  // links were followed to list the tree (docs/hf-layouts.md)
  std::vector<OmsResource> resources;  // sorted
  Digest root{};

  std::string RootHex() const { return ToHex(root); }
  // "sha256" in files mode, "sha256-sharded-<shard_size>" in shards mode.
  std::string Algorithm() const;
  // "path" in files mode, "path:start:end" in shards mode.
  std::string ResourceName(const OmsResource& r) const;
};

// model_signing's default shard size (bytes).
inline constexpr uint64_t kDefaultOmsShardSize = 1'000'000'000;
// The most shards one manifest lists: each is a digest and a name held until the manifest is
// built, so a tiny shard size over a large tree must not make billions of them.
inline constexpr uint64_t kMaxOmsShards = 1u << 20;

// The [start, end) ranges of a file of `size` bytes in shards mode; none when size is 0.
std::vector<std::pair<uint64_t, uint64_t>> OmsShardRanges(uint64_t size, uint64_t shard_size);

// Sorts `resources` and computes the root.
OmsManifest BuildOmsManifest(OmsMode mode, uint64_t shard_size, std::string model_name,
                             std::vector<std::string> ignore_paths,
                             std::vector<OmsResource> resources);

// {"serialization": {...}, "root_sha256": hex, "resources": [{"name","algorithm","digest"}]}.
nlohmann::json OmsManifestJson(const OmsManifest& m);

// The in-toto Statement v1 that model_signing v1.0 signs (predicateType
// https://model_signing/signature/v1.0): subject = {model_name, sha256: root}, predicate =
// {serialization, resources}. Unsigned; signing is the evidence module's job.
nlohmann::json OmsInTotoStatement(const OmsManifest& m);

}  // namespace ckpt

#endif  // CKPT_CORE_FINGERPRINT_OMS_MANIFEST_H_
