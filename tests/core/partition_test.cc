#include "core/fingerprint/partition.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

std::vector<nlohmann::json> Parts(const std::string& root, unsigned count) {
  std::vector<nlohmann::json> parts;
  for (unsigned i = 0; i < count; ++i) {
    FingerprintOptions o;
    o.part = {i, count};
    auto fp = FingerprintTree(root, o, NoProgress());
    EXPECT_TRUE(fp.ok()) << fp.status();
    parts.push_back(FingerprintToJson(*fp, &o.part));
  }
  return parts;
}

TEST(FingerprintPartition, EveryFileInExactlyOnePartAndLoadBalanced) {
  auto tree = ListTree(::ckpt::testing::Fixture("mini-kimi-x4t").string());
  ASSERT_TRUE(tree.ok());
  for (unsigned count = 1; count <= 6; ++count) {
    std::multiset<std::string> seen;
    uint64_t largest_file = 0, max_load = 0, total = 0;
    for (const TreeFile& f : tree->files) largest_file = std::max(largest_file, f.size);
    for (unsigned i = 0; i < count; ++i) {
      uint64_t load = 0;
      for (const TreeFile& f : FilesOfPart(tree->files, {i, count})) {
        seen.insert(f.path);
        load += f.size;
      }
      max_load = std::max(max_load, load);
      total += load;
    }
    EXPECT_EQ(seen.size(), tree->files.size());
    for (const TreeFile& f : tree->files) EXPECT_EQ(seen.count(f.path), 1u) << f.path;
    // Greedy largest-first: no part exceeds the average by more than one file.
    EXPECT_LE(max_load, total / count + largest_file);
  }
}

TEST(FingerprintPartition, MergedPartsEqualASingleRun) {
  std::string root = ::ckpt::testing::Fixture("mini-kimi-mxfp4").string();
  auto single = FingerprintTree(root, {}, NoProgress());
  ASSERT_TRUE(single.ok());
  // At most one part per file (tests/core/cli_bounds_test.cc).
  for (unsigned count : {1u, 2u, 3u, 4u}) {
    auto merged = MergeFingerprintParts(root, Parts(root, count));
    ASSERT_TRUE(merged.ok()) << merged.status();
    EXPECT_EQ(FingerprintToJson(*merged), FingerprintToJson(*single)) << count << " parts";
  }
}

TEST(FingerprintPartition, RejectsIncompleteOrInconsistentParts) {
  TempDir dir;
  std::string root = CopyFixture("mini-kimi-mxfp4", dir).string();
  auto parts = Parts(root, 3);

  auto missing = MergeFingerprintParts(root, {parts[0], parts[2]});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("part 1 of 3 is missing"));

  auto twice = MergeFingerprintParts(root, {parts[0], parts[1], parts[1]});
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("given twice"));

  auto resized = parts;
  resized[1]["files"][0]["size"] = resized[1]["files"][0]["size"].get<uint64_t>() + 1;
  auto bad_size = MergeFingerprintParts(root, resized);
  ASSERT_FALSE(bad_size.ok());
  EXPECT_THAT(std::string(bad_size.status().message()), HasSubstr("bytes but part 1 hashed"));

  auto foreign = parts;
  foreign[2]["root"] = "/elsewhere";
  EXPECT_FALSE(MergeFingerprintParts(root, foreign).ok());

  // A file that appeared after the parts ran is in no part.
  ::ckpt::testing::WriteAll(dir / "mini-kimi-mxfp4/README.md", std::string("late"));
  auto late = MergeFingerprintParts(root, parts);
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("README.md is in no part"));
}

TEST(FingerprintPartition, PartsNeedFilesMode) {
  FingerprintOptions o;
  o.part = {0, 2};
  o.manifest_mode = OmsMode::kShards;
  auto fp = FingerprintTree(::ckpt::testing::Fixture("mini-kimi-mxfp4").string(), o,
                            NoProgress());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.part = {2, 2};
  fp = FingerprintTree(::ckpt::testing::Fixture("mini-kimi-mxfp4").string(), o, NoProgress());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
