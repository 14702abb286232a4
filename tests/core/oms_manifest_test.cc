// OMS (model-signing) manifest: shard ranges, resource order and ROOT recomputed independently
// with `sha256sum`, and the in-toto statement shape.
#include "core/fingerprint/oms_manifest.h"

#include <cstdio>
#include <filesystem>
#include <limits>

#include "core/fingerprint/fingerprint.h"
#include "core/io/tree_walk.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

std::string ShellSha256(const std::string& pipeline) {
  FILE* p = ::popen(pipeline.c_str(), "r");
  if (p == nullptr) return "popen failed";
  char buf[128] = {};
  size_t n = std::fread(buf, 1, 64, p);
  ::pclose(p);
  return std::string(buf, n);
}

std::string Sha256sumOfRange(const fs::path& file, uint64_t begin, uint64_t len) {
  return ShellSha256("tail -c +" + std::to_string(begin + 1) + " '" + file.string() +
                     "' | head -c " + std::to_string(len) + " | sha256sum");
}

TEST(OmsShardRanges, CutsAtMultiplesAndShortensTheLast) {
  EXPECT_EQ(OmsShardRanges(0, 10), Ranges{});
  EXPECT_EQ(OmsShardRanges(1, 10), (Ranges{{0, 1}}));
  EXPECT_EQ(OmsShardRanges(10, 10), (Ranges{{0, 10}}));
  EXPECT_EQ(OmsShardRanges(25, 10), (Ranges{{0, 10}, {10, 20}, {20, 25}}));
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  Ranges huge = OmsShardRanges(max, max / 2 + 1);  // no overflow past the end
  ASSERT_EQ(huge.size(), 2u);
  EXPECT_EQ(huge[1], std::make_pair(max / 2 + 1, max));
}

TEST(PosixPathLess, ComparesComponentByComponent) {
  EXPECT_TRUE(PosixPathLess("a/b", "a.b"));  // as Python's PurePosixPath, not as bytes
  EXPECT_FALSE(PosixPathLess("a.b", "a/b"));
  EXPECT_TRUE(PosixPathLess("a", "a/b"));
  EXPECT_TRUE(PosixPathLess("a-b", "a.b"));
  EXPECT_TRUE(PosixPathLess("Z", "a"));
  EXPECT_FALSE(PosixPathLess("a", "a"));
}

TEST(OmsManifest, ShardsModeResourcesAndRootRecomputedWithSha256sum) {
  TempDir dir;
  fs::create_directories(dir / "m/a");
  std::string bytes;
  for (int i = 0; i < 25; ++i) bytes.push_back(static_cast<char>('A' + i));
  WriteAll(dir / "m/a.b", bytes.substr(0, 10));   // exactly one shard
  WriteAll(dir / "m/a/x", bytes);                 // 3 shards, the last 5 bytes
  WriteAll(dir / "m/empty", std::string());       // no shard
  FingerprintOptions o;
  o.manifest_mode = OmsMode::kShards;
  o.shard_size = 10;
  auto fp = FingerprintTree((dir / "m").string(), o, NoProgress());
  ASSERT_TRUE(fp.ok()) << fp.status();
  const OmsManifest& m = fp->manifest;
  std::vector<std::string> names;
  for (const OmsResource& r : m.resources) names.push_back(m.ResourceName(r));
  EXPECT_THAT(names, ::testing::ElementsAre("a/x:0:10", "a/x:10:20", "a/x:20:25", "a.b:0:10"));
  EXPECT_EQ(m.Algorithm(), "sha256-sharded-10");

  std::string concat;
  for (const OmsResource& r : m.resources) {
    std::string hex = Sha256sumOfRange(dir / "m" / r.path, r.start, r.end - r.start);
    EXPECT_EQ(ToHex(r.digest), hex) << m.ResourceName(r);
    for (size_t i = 0; i < 64; i += 2) {
      concat.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
  }
  WriteAll(dir / "concat", concat);
  EXPECT_EQ(m.RootHex(), ShellSha256("sha256sum '" + (dir / "concat").string() + "'"));
  // The whole-file digests (LFS oids) are still computed in shards mode.
  ASSERT_EQ(fp->files.size(), 3u);
  EXPECT_EQ(ToHex(*fp->files[1].sha256), ShellSha256("printf 'ABCDEFGHIJ' | sha256sum"));
}

TEST(OmsManifest, ShardsModeWithoutFileDigestsGivesTheSameRoot) {
  TempDir dir;
  fs::create_directory(dir / "m");
  WriteAll(dir / "m/w.bin", std::string(1000, 'q'));
  FingerprintOptions with, without;
  with.manifest_mode = without.manifest_mode = OmsMode::kShards;
  with.shard_size = without.shard_size = 64;
  without.file_digests = false;
  auto a = FingerprintTree((dir / "m").string(), with, NoProgress());
  auto b = FingerprintTree((dir / "m").string(), without, NoProgress());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->manifest.RootHex(), b->manifest.RootHex());
  EXPECT_FALSE(b->files[0].sha256.has_value());
  EXPECT_EQ(b->hashed_bytes, 1000u);
  EXPECT_EQ(a->hashed_bytes, 2000u);

  FingerprintOptions invalid;
  invalid.file_digests = false;  // files mode needs them
  EXPECT_EQ(FingerprintTree((dir / "m").string(), invalid, NoProgress()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OmsManifest, BuildSortsResourcesAndHashesRawDigests) {
  Digest d1{}, d2{};
  d1.fill(1);
  d2.fill(2);
  OmsManifest m = BuildOmsManifest(OmsMode::kShards, 4, "model", {".git"},
                                   {{"b", 4, 8, d2}, {"b", 0, 4, d1}, {"a.b", 0, 4, d2}});
  ASSERT_EQ(m.resources.size(), 3u);
  EXPECT_EQ(m.ResourceName(m.resources[0]), "a.b:0:4");
  EXPECT_EQ(m.ResourceName(m.resources[1]), "b:0:4");
  std::vector<uint8_t> concat;
  for (const Digest& d : {d2, d1, d2}) concat.insert(concat.end(), d.begin(), d.end());
  EXPECT_EQ(m.root, Sha256Of(concat));
}

TEST(OmsManifest, InTotoStatementCarriesRootAndResources) {
  Digest d{};
  d.fill(7);
  OmsManifest m = BuildOmsManifest(OmsMode::kFiles, 0, "my-model",
                                   {".git", ".gitattributes", ".github", ".gitignore"},
                                   {{"w.safetensors", 0, 10, d}});
  nlohmann::json s = OmsInTotoStatement(m);
  EXPECT_EQ(s["_type"], "https://in-toto.io/Statement/v1");
  EXPECT_EQ(s["predicateType"], "https://model_signing/signature/v1.0");
  ASSERT_EQ(s["subject"].size(), 1u);
  EXPECT_EQ(s["subject"][0]["name"], "my-model");
  EXPECT_EQ(s["subject"][0]["digest"]["sha256"], m.RootHex());
  EXPECT_EQ(s["predicate"]["serialization"]["method"], "files");
  EXPECT_EQ(s["predicate"]["serialization"]["hash_type"], "sha256");
  EXPECT_EQ(s["predicate"]["serialization"]["allow_symlinks"], false);
  EXPECT_EQ(s["predicate"]["serialization"]["ignore_paths"].size(), 4u);
  EXPECT_FALSE(s["predicate"]["serialization"].contains("shard_size"));
  ASSERT_EQ(s["predicate"]["resources"].size(), 1u);
  EXPECT_EQ(s["predicate"]["resources"][0]["name"], "w.safetensors");
  EXPECT_EQ(s["predicate"]["resources"][0]["digest"], ToHex(d));
  EXPECT_EQ(OmsManifestJson(m)["root_sha256"], m.RootHex());
}

}  // namespace
}  // namespace ckpt
