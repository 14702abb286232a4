// FingerprintTree: digests checked against `sha256sum` (an independent implementation run via
// popen), model-signing tree rules, change detection and thread-count independence.
#include "core/fingerprint/fingerprint.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

// Runs a shell pipeline ending in sha256sum and returns the hex digest it printed.
std::string ShellSha256(const std::string& pipeline) {
  FILE* p = ::popen(pipeline.c_str(), "r");
  if (p == nullptr) return "popen failed";
  char buf[128] = {};
  size_t n = std::fread(buf, 1, 64, p);
  ::pclose(p);
  return std::string(buf, n);
}

std::string Sha256sum(const fs::path& file) {
  return ShellSha256("sha256sum '" + file.string() + "'");
}

std::string Sha256sumOfRange(const fs::path& file, uint64_t begin, uint64_t len) {
  return ShellSha256("tail -c +" + std::to_string(begin + 1) + " '" + file.string() +
                     "' | head -c " + std::to_string(len) + " | sha256sum");
}

absl::StatusOr<Fingerprint> FingerprintDir(const fs::path& root, FingerprintOptions o = {}) {
  return FingerprintTree(root.string(), o, NoProgress());
}

TEST(Fingerprint, FixtureFileDigestsEqualSha256sum) {
  auto fp = FingerprintDir(Fixture("mini-kimi-mxfp4"));
  ASSERT_TRUE(fp.ok()) << fp.status();
  std::vector<std::string> paths;
  for (const FileFingerprint& f : fp->files) {
    paths.push_back(f.path);
    ASSERT_TRUE(f.sha256.has_value());
    EXPECT_EQ(ToHex(*f.sha256), Sha256sum(Fixture("mini-kimi-mxfp4") / f.path)) << f.path;
    EXPECT_EQ(f.size, fs::file_size(Fixture("mini-kimi-mxfp4") / f.path));
  }
  EXPECT_THAT(paths, ::testing::ElementsAre("config.json", "model-00001-of-00002.safetensors",
                                            "model-00002-of-00002.safetensors",
                                            "model.safetensors.index.json"));
}

TEST(Fingerprint, FilesModeRootIsDigestOfConcatenatedFileDigests) {
  TempDir dir;
  auto fp = FingerprintDir(Fixture("mini-kimi-mxfp4"));
  ASSERT_TRUE(fp.ok()) << fp.status();
  // Independent route: raw digests from sha256sum, concatenated in path order, sha256sum'd.
  std::string concat;
  for (const char* name : {"config.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors", "model.safetensors.index.json"}) {
    std::string hex = Sha256sum(Fixture("mini-kimi-mxfp4") / name);
    for (size_t i = 0; i < 64; i += 2) {
      concat.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
  }
  WriteAll(dir / "concat", concat);
  EXPECT_EQ(fp->manifest.RootHex(), Sha256sum(dir / "concat"));
  EXPECT_EQ(fp->manifest.resources.size(), 4u);
  EXPECT_EQ(fp->manifest.model_name, "mini-kimi-mxfp4");
}

TEST(Fingerprint, TensorDigestsEqualDigestOfTheirByteRange) {
  auto fp = FingerprintDir(Fixture("mini-kimi-mxfp4"));
  ASSERT_TRUE(fp.ok()) << fp.status();
  auto ckpt = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(fp->tensors.size(), (*ckpt)->TensorNames().size());
  size_t checked_by_shell = 0;
  for (size_t i = 0; i < fp->tensors.size(); ++i) {
    const TensorFingerprint& t = fp->tensors[i];
    auto ref = (*ckpt)->Find(t.tensor);
    ASSERT_TRUE(ref.has_value()) << t.tensor;
    EXPECT_EQ((*ckpt)->RelativePath(*ref->file), t.file);
    EXPECT_EQ(t.bytes, ref->info->num_bytes());
    // Every tensor through the checkpoint reader's span; a sample also through the shell.
    EXPECT_EQ(t.sha256, Sha256Of(ref->bytes())) << t.tensor;
    if (i % 97 == 0 || i + 1 == fp->tensors.size()) {
      uint64_t offset = ref->file->data_start() + ref->info->begin;
      EXPECT_EQ(ToHex(t.sha256),
                Sha256sumOfRange(Fixture("mini-kimi-mxfp4") / t.file, offset, t.bytes))
          << t.tensor;
      ++checked_by_shell;
    }
  }
  EXPECT_GE(checked_by_shell, 3u);
  size_t counted = 0;
  for (const FileFingerprint& f : fp->files) counted += f.tensor_count;
  EXPECT_EQ(counted, fp->tensors.size());
}

TEST(Fingerprint, IgnoresModelSigningPathsAtTheRootOnly) {
  TempDir dir;
  fs::create_directories(dir / "m/.git/objects");
  fs::create_directories(dir / "m/.github/workflows");
  fs::create_directories(dir / "m/sub");
  WriteAll(dir / "m/.git/objects/x", std::string("git object"));
  WriteAll(dir / "m/.github/workflows/ci.yml", std::string("ci"));
  WriteAll(dir / "m/.gitattributes", std::string("*.safetensors filter=lfs"));
  WriteAll(dir / "m/.gitignore", std::string("*.tmp"));
  WriteAll(dir / "m/.git-notes", std::string("not ignored: only exact names"));
  WriteAll(dir / "m/sub/.gitignore", std::string("nested: model_signing hashes it"));
  WriteAll(dir / "m/weights.bin", std::string("w"));
  auto fp = FingerprintDir(dir / "m");
  ASSERT_TRUE(fp.ok()) << fp.status();
  std::vector<std::string> paths;
  for (const FileFingerprint& f : fp->files) paths.push_back(f.path);
  EXPECT_THAT(paths, ::testing::ElementsAre(".git-notes", "sub/.gitignore", "weights.bin"));
}

TEST(Fingerprint, SymlinksAreRefusedByName) {
  TempDir dir;
  fs::create_directories(dir / "m/sub");
  WriteAll(dir / "m/a.bin", std::string("a"));
  fs::create_symlink(dir / "m/a.bin", dir / "m/sub/link.bin");
  auto fp = FingerprintDir(dir / "m");
  ASSERT_FALSE(fp.ok());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("sub/link.bin"));
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("symbolic link"));

  fs::remove(dir / "m/sub/link.bin");
  fs::create_directory_symlink(dir / "m/sub", dir / "m/dirlink");
  auto fp2 = FingerprintDir(dir / "m");
  ASSERT_FALSE(fp2.ok());
  EXPECT_THAT(std::string(fp2.status().message()), HasSubstr("dirlink"));
}

TEST(Fingerprint, EmptyDirectoryHasNoFilesAndTheEmptyRoot) {
  TempDir dir;
  fs::create_directory(dir / "empty");
  auto fp = FingerprintDir(dir / "empty");
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_TRUE(fp->files.empty());
  EXPECT_TRUE(fp->manifest.resources.empty());
  EXPECT_EQ(fp->manifest.RootHex(), ShellSha256("printf '' | sha256sum"));
}

TEST(Fingerprint, MissingRootIsNotFound) {
  TempDir dir;
  auto fp = FingerprintDir(dir / "nope");
  ASSERT_FALSE(fp.ok());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kNotFound);
}

TEST(Fingerprint, MalformedSafetensorsIsNamedUnlessTensorDigestsAreOff) {
  TempDir dir;
  fs::create_directory(dir / "m");
  fs::copy_file(Fixture("malformed/offsets_gap.safetensors"), dir / "m/bad.safetensors");
  auto fp = FingerprintDir(dir / "m");
  ASSERT_FALSE(fp.ok());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("bad.safetensors"));
  FingerprintOptions o;
  o.tensor_digests = false;
  auto files_only = FingerprintDir(dir / "m", o);
  ASSERT_TRUE(files_only.ok()) << files_only.status();
  EXPECT_EQ(ToHex(*files_only->files[0].sha256), Sha256sum(dir / "m/bad.safetensors"));
}

// Rewrites the file named `victim` the first time any bytes are reported hashed.
// Appends to `victim` at the `fire_at`-th progress report.
class ModifyingProgress final : public Progress {
 public:
  explicit ModifyingProgress(fs::path victim, int fire_at = 1)
      : victim_(std::move(victim)), fire_at_(fire_at) {}
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t) override {
    if (done_ || ++reports_ < fire_at_) return;
    done_ = true;
    std::ofstream out(victim_, std::ios::binary | std::ios::app);
    out << "appended while hashing";
  }
  void End() override {}

 private:
  const fs::path victim_;
  const int fire_at_;
  int reports_ = 0;
  bool done_ = false;
};

TEST(Fingerprint, FileChangedDuringHashingIsDataLoss) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  // One thread reads the largest file first: it is appended to while being hashed.
  ModifyingProgress progress(root / "model-00001-of-00002.safetensors");
  FingerprintOptions o;
  o.threads = 1;
  auto fp = FingerprintTree(root.string(), o, progress);
  ASSERT_FALSE(fp.ok());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("model-00001-of-00002.safetensors"));
}

TEST(Fingerprint, FileChangedAfterItWasHashedIsDataLoss) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  // One thread, largest file first: its length prefix, header and data are three reports; the
  // fourth comes from the next file, after the first one was read whole and hashed. Only the
  // end-of-run re-stat can see this change.
  ModifyingProgress progress(root / "model-00001-of-00002.safetensors", 4);
  FingerprintOptions o;
  o.threads = 1;
  auto fp = FingerprintTree(root.string(), o, progress);
  ASSERT_FALSE(fp.ok());
  EXPECT_EQ(fp.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT(std::string(fp.status().message()), HasSubstr("changed after it was read"));
}

// Sums what is reported, to check that the bar's total is exactly what gets advanced.
class CountingProgress final : public Progress {
 public:
  void Begin(std::string_view, uint64_t total) override { total_ = total; }
  void Advance(uint64_t n) override { done_ += n; }
  void End() override { ended_ = true; }
  uint64_t total_ = 0;
  std::atomic<uint64_t> done_{0};
  bool ended_ = false;
};

TEST(Fingerprint, ProgressAdvancesExactlyToItsTotal) {
  for (OmsMode mode : {OmsMode::kFiles, OmsMode::kShards}) {
    CountingProgress progress;
    FingerprintOptions o;
    o.manifest_mode = mode;
    o.shard_size = 1u << 20;
    auto fp = FingerprintTree(Fixture("mini-kimi-mxfp4").string(), o, progress);
    ASSERT_TRUE(fp.ok()) << fp.status();
    EXPECT_TRUE(progress.ended_);
    EXPECT_GT(progress.total_, 0u);
    EXPECT_EQ(progress.done_.load(), progress.total_);
  }
}

TEST(Fingerprint, TreesLargerThanOneMappingBatchKeepEveryFileInOrder) {
  TempDir dir;
  fs::create_directory(dir / "m");
  constexpr int kFiles = 4100;  // more than the 4096 files mapped at once
  for (int i = 0; i < kFiles; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "f%05d", i);
    WriteAll(dir / "m" / name, std::string(name));
  }
  auto fp = FingerprintDir(dir / "m");
  ASSERT_TRUE(fp.ok()) << fp.status();
  ASSERT_EQ(fp->files.size(), static_cast<size_t>(kFiles));
  ASSERT_EQ(fp->manifest.resources.size(), static_cast<size_t>(kFiles));
  for (int i = 0; i < kFiles; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "f%05d", i);
    ASSERT_EQ(fp->files[i].path, name);
    std::string content(name);
    ASSERT_EQ(*fp->files[i].sha256,
              Sha256Of({reinterpret_cast<const uint8_t*>(content.data()), content.size()}));
  }
  EXPECT_EQ(ToHex(*fp->files[4099].sha256), ShellSha256("printf f04099 | sha256sum"));
}

// A safetensors file of `tensors` U8 tensors of the given sizes, filled with a byte pattern.
void WriteSafetensors(const fs::path& p, const std::vector<uint64_t>& sizes) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    h["t" + std::to_string(i)] = {{"dtype", "U8"}, {"shape", {sizes[i]}},
                                  {"data_offsets", {off, off + sizes[i]}}};
    off += sizes[i];
  }
  std::string header = h.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  for (uint64_t i = 0; i < off; ++i) out.push_back(static_cast<char>((i * 131 + i / 7) & 0xff));
  WriteAll(p, out);
}

TEST(Fingerprint, ThreadCountDoesNotChangeAnyDigest) {
  TempDir dir;
  fs::create_directories(dir / "m/nested");
  // Tensors above and below the batching size, files above the 8 MiB hashing chunk.
  WriteSafetensors(dir / "m/a.safetensors", {3u << 20, 10u << 20, 100, 0, 5u << 20});
  WriteSafetensors(dir / "m/nested/b.safetensors", std::vector<uint64_t>(300, 4096));
  WriteAll(dir / "m/empty.txt", std::string());
  WriteAll(dir / "m/notes.txt", std::string(17u << 20, 'x'));
  for (OmsMode mode : {OmsMode::kFiles, OmsMode::kShards}) {
    FingerprintOptions one, many;
    one.threads = 1;
    many.threads = 6;
    one.manifest_mode = many.manifest_mode = mode;
    one.shard_size = many.shard_size = 3u << 20;
    auto a = FingerprintDir(dir / "m", one);
    auto b = FingerprintDir(dir / "m", many);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->files.size(), 4u);
    ASSERT_EQ(a->tensors.size(), 305u);
    for (size_t i = 0; i < a->files.size(); ++i) EXPECT_EQ(a->files[i].sha256, b->files[i].sha256);
    for (size_t i = 0; i < a->tensors.size(); ++i) {
      EXPECT_EQ(a->tensors[i].sha256, b->tensors[i].sha256) << a->tensors[i].tensor;
    }
    EXPECT_EQ(a->manifest.RootHex(), b->manifest.RootHex());
    EXPECT_EQ(a->hashed_bytes, b->hashed_bytes);
    EXPECT_EQ(ToHex(*b->files[3].sha256), Sha256sum(dir / "m/notes.txt"));
  }
}

}  // namespace
}  // namespace ckpt
