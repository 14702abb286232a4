#include "core/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(Checkpoint, OpensShardedFixture) {
  auto c = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->layout(), CheckpointLayout::kSharded);
  EXPECT_EQ((*c)->shards().size(), 2u);
  EXPECT_EQ((*c)->text_config().at("hidden_size"), 256);
  auto t = (*c)->Find("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->info->dtype, DType::kU8);
  EXPECT_EQ(t->info->shape, (std::vector<uint64_t>{192, 64}));
  EXPECT_EQ(t->bytes().size(), 192u * 64u);
  EXPECT_TRUE((*c)->CheckUnchanged().ok());
}

TEST(Checkpoint, OpensNvfp4AndX4T) {
  auto nv = Checkpoint::Open(Fixture("mini-kimi-nvfp4").string());
  ASSERT_TRUE(nv.ok()) << nv.status();
  auto x4t = Checkpoint::Open(Fixture("mini-kimi-x4t").string());
  ASSERT_TRUE(x4t.ok()) << x4t.status();
  EXPECT_EQ((*x4t)->layout(), CheckpointLayout::kX4TContainer);
  EXPECT_EQ((*x4t)->shards().size(), 3u);  // two expert shards + metadata/dense.safetensors
  EXPECT_EQ((*x4t)->text_config().at("quantization_config").at("quant_method"), "kimi_x4t");
}

TEST(Checkpoint, SingleFileLayout) {
  TempDir dir;
  fs::create_directory(dir / "m");
  fs::copy_file(Fixture("malformed/valid_e8m0.safetensors"), dir / "m/model.safetensors");
  WriteAll(dir / "m/config.json", std::string("{}"));
  auto c = Checkpoint::Open((dir / "m").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->layout(), CheckpointLayout::kSingleFile);
  EXPECT_EQ((*c)->TensorNames().size(), 1u);
}

// A 550 KB config of 40,000 objects (5.8 s with the callback parser) opens.
TEST(Checkpoint, LargeConfigOpens) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  std::ifstream in(root / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["layer_notes"] = nlohmann::json::array();
  for (int i = 0; i < 40000; ++i) config["layer_notes"].push_back({{"i", i}});
  WriteAll(root / "config.json", config.dump());
  auto c = Checkpoint::Open(root.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->config().at("layer_notes").size(), 40000u);
  EXPECT_EQ((*c)->config().at("layer_notes")[39999].at("i"), 39999);
}

// Python's json keeps the last of two equal keys and other readers the first; which
// quantization_config applies must not depend on the reader.
TEST(Checkpoint, DuplicateConfigKeyIsNamed) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  std::ifstream in(root / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.insert(text.find('{') + 1, R"("quantization_config":{"quant_method":"none"},)");
  WriteAll(root / "config.json", text);
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(c.status()), HasSubstr("config.json"));
  EXPECT_THAT(Message(c.status()), HasSubstr("duplicate JSON key 'quantization_config'"));
}

void EditIndex(const fs::path& root, const std::function<void(nlohmann::json&)>& edit) {
  fs::path p = root / "model.safetensors.index.json";
  std::ifstream in(p);
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  WriteAll(p, j.dump(1));
}

const char* kTensor = "language_model.model.layers.0.mlp.down_proj.weight";

TEST(Checkpoint, IndexNamingWrongShardIsNamed) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditIndex(root, [](nlohmann::json& j) {
    j["weight_map"][kTensor] = "model-00002-of-00002.safetensors";
  });
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr(kTensor));
  EXPECT_THAT(Message(c.status()), HasSubstr("stored in model-00001"));
}

TEST(Checkpoint, ShardTensorMissingFromIndex) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditIndex(root, [](nlohmann::json& j) { j["weight_map"].erase(kTensor); });
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("missing from"));
}

TEST(Checkpoint, IndexTensorNotInAnyShard) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditIndex(root, [](nlohmann::json& j) {
    j["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors";
  });
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("'ghost.weight'"));
}

TEST(Checkpoint, TotalSizeMismatch) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditIndex(root, [](nlohmann::json& j) { j["metadata"]["total_size"] = 1; });
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("total_size"));
}

TEST(Checkpoint, DotDotInWeightMapIsDenied) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  EditIndex(root, [](nlohmann::json& j) {
    j["weight_map"][kTensor] = "../model-00001-of-00002.safetensors";
  });
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(Checkpoint, SymlinkLeavingRootIsDenied) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  fs::path shard = root / "model-00002-of-00002.safetensors";
  fs::rename(shard, dir / "outside.safetensors");
  fs::create_symlink(dir / "outside.safetensors", shard);
  // The one read lists the tree without following links: any link is refused by name.
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(c.status()), HasSubstr("model-00002-of-00002.safetensors: symbolic link refused"));
}

TEST(Checkpoint, NestedQuantizationConfigMustAgree) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  std::ifstream in(root / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["text_config"]["quantization_config"]["format"] = "nvfp4-pack-quantized";
  WriteAll(root / "config.json", j.dump());
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("disagrees"));
}

TEST(Checkpoint, TruncatedShardIsDataLoss) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  fs::path shard = root / "model-00001-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 1);
  auto c = Checkpoint::Open(root.string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(c.status()), HasSubstr("model-00001-of-00002.safetensors"));
}

TEST(Checkpoint, DetectsFileReplacedAfterOpen) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  auto c = Checkpoint::Open(root.string());
  ASSERT_TRUE(c.ok()) << c.status();
  fs::path shard = root / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> bytes = ReadAll(shard);
  fs::remove(shard);
  WriteAll(shard, bytes);  // same content, new inode
  absl::Status s = (*c)->CheckUnchanged();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(s), HasSubstr("model-00002-of-00002.safetensors"));
}

}  // namespace
}  // namespace ckpt
