#include "core/fingerprint/oms_manifest.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/io/tree_walk.h"

namespace ckpt {
namespace {

nlohmann::json Serialization(const OmsManifest& m) {
  nlohmann::json s = {{"method", m.mode == OmsMode::kFiles ? "files" : "shards"},
                      {"hash_type", m.Algorithm()},
                      {"allow_symlinks", m.allow_symlinks},
                      {"ignore_paths", m.ignore_paths}};
  if (m.mode == OmsMode::kShards) s["shard_size"] = m.shard_size;
  return s;
}

nlohmann::json Resources(const OmsManifest& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const OmsResource& r : m.resources) {
    out.push_back({{"name", m.ResourceName(r)},
                   {"algorithm", m.Algorithm()},
                   {"digest", ToHex(r.digest)}});
  }
  return out;
}

}  // namespace

std::string OmsManifest::Algorithm() const {
  return mode == OmsMode::kFiles ? "sha256" : absl::StrCat("sha256-sharded-", shard_size);
}

std::string OmsManifest::ResourceName(const OmsResource& r) const {
  return mode == OmsMode::kFiles ? r.path : absl::StrCat(r.path, ":", r.start, ":", r.end);
}

std::vector<std::pair<uint64_t, uint64_t>> OmsShardRanges(uint64_t size, uint64_t shard_size) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t start = 0; start < size;) {
    uint64_t len = std::min(shard_size, size - start);  // no start + shard_size: may overflow
    out.emplace_back(start, start + len);
    start += len;
  }
  return out;
}

OmsManifest BuildOmsManifest(OmsMode mode, uint64_t shard_size, std::string model_name,
                             std::vector<std::string> ignore_paths,
                             std::vector<OmsResource> resources) {
  std::sort(resources.begin(), resources.end(), [](const OmsResource& a, const OmsResource& b) {
    if (a.path != b.path) return PosixPathLess(a.path, b.path);
    return std::tie(a.start, a.end) < std::tie(b.start, b.end);
  });
  OmsManifest m;
  m.mode = mode;
  m.shard_size = mode == OmsMode::kShards ? shard_size : 0;
  m.model_name = std::move(model_name);
  m.ignore_paths = std::move(ignore_paths);
  Sha256 h;
  for (const OmsResource& r : resources) h.Update(r.digest);
  m.root = h.Finish();
  m.resources = std::move(resources);
  return m;
}

nlohmann::json OmsManifestJson(const OmsManifest& m) {
  return {{"serialization", Serialization(m)},
          {"root_sha256", m.RootHex()},
          {"resources", Resources(m)}};
}

nlohmann::json OmsInTotoStatement(const OmsManifest& m) {
  return {{"_type", "https://in-toto.io/Statement/v1"},
          {"subject", {{{"name", m.model_name}, {"digest", {{"sha256", m.RootHex()}}}}}},
          {"predicateType", "https://model_signing/signature/v1.0"},
          {"predicate", {{"serialization", Serialization(m)}, {"resources", Resources(m)}}}};
}

}  // namespace ckpt
