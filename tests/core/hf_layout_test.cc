// Hugging Face layouts (docs/hf-layouts.md): hub cache snapshots and local-dir downloads built
// the way huggingface_hub builds them (tests/core/hf_layouts.h) fingerprint to the ROOT of a
// plain copy; links that leave the repository folder, the root or the --confine directories
// are refused naming the link and its target; blobs and etags that disagree with the bytes,
// and mixed commits, are findings; a link retargeted after the read is DATA_LOSS.
#include "core/io/hf_layout.h"

#include <filesystem>

#include "core/fingerprint/fingerprint.h"
#include "core/git_blob_sha1.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/hf_layouts.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

constexpr char kCommit[] = "0123456789abcdef0123456789abcdef01234567";
constexpr char kOtherCommit[] = "fedcba9876543210fedcba9876543210fedcba98";

std::string RootOf(const fs::path& dir, const LinkOptions& links = {}) {
  FingerprintOptions o;
  o.tensor_digests = false;
  o.links = links;
  auto fp = FingerprintTree(dir.string(), o, NoProgress());
  EXPECT_TRUE(fp.ok()) << fp.status();
  return fp.ok() ? fp->manifest.RootHex() : "";
}

absl::Status FingerprintStatus(const fs::path& dir, const LinkOptions& links = {}) {
  FingerprintOptions o;
  o.tensor_digests = false;
  o.links = links;
  return FingerprintTree(dir.string(), o, NoProgress()).status();
}

// Lists and reads `dir` with file digests, then checks its layout.
struct Checked {
  LayoutInfo layout;
  std::vector<LayoutFinding> findings;
};
Checked CheckDir(const fs::path& dir) {
  auto listing = ListLayout(dir.string());
  EXPECT_TRUE(listing.ok()) << listing.status();
  if (!listing.ok()) return {};
  ReadOptions read;
  read.keep = ReadOptions::Keep::kNothing;
  read.tensor_digests = false;
  auto image = ReadTree(std::move(listing->listing), read, NoProgress());
  EXPECT_TRUE(image.ok()) << image.status();
  if (!image.ok()) return {};
  return {listing->layout, CheckLayout(listing->layout, **image)};
}

std::vector<std::string> Codes(const std::vector<LayoutFinding>& fs, bool failing_only) {
  std::vector<std::string> out;
  for (const LayoutFinding& f : fs) {
    if (f.fails || !failing_only) out.push_back(f.code);
  }
  return out;
}

TEST(GitBlobIdTest, MatchesGitHashObject) {
  // `printf 'hello\n' | git hash-object --stdin`
  const std::string hello = "hello\n";
  EXPECT_EQ(ToHex(GitBlobIdOf(std::span<const uint8_t>(
                reinterpret_cast<const uint8_t*>(hello.data()), hello.size()))),
            "ce013625030ba8dba906f756967f9e9ca394464a");
  // `git hash-object /dev/null`: the empty blob
  EXPECT_EQ(ToHex(GitBlobIdOf({})), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

TEST(HubSnapshotTest, SameRootAsPlainCopyAndModelRef) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/mini-kimi", kCommit);
  EXPECT_EQ(RootOf(hub.snapshot), RootOf(Fixture("mini-kimi-mxfp4")));
  Checked c = CheckDir(hub.snapshot);
  EXPECT_EQ(c.layout.kind, TreeLayout::kHubSnapshot);
  EXPECT_EQ(c.layout.repo_id, "org/mini-kimi");
  EXPECT_EQ(c.layout.commit, kCommit);
  EXPECT_EQ(c.layout.refs_main, kCommit);
  EXPECT_EQ(c.layout.links_followed, 4u);
  EXPECT_EQ(c.layout.ModelRef(), std::string("org/mini-kimi@") + kCommit);
  EXPECT_TRUE(c.findings.empty()) << c.findings.front().message;
}

TEST(HubSnapshotTest, RepositoryFolderItselfNamesTheSnapshotToAudit) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  absl::Status s = FingerprintStatus(hub.repo);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(std::string("refs/main: snapshots/") + kCommit));
}

TEST(HubSnapshotTest, PathThroughASymlinkStillFindsTheRepo) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  fs::create_directory_symlink(hub.snapshot, dir / "latest");  // what a user may point at
  EXPECT_EQ(RootOf(dir / "latest"), RootOf(Fixture("mini-kimi-mxfp4")));
}

TEST(HubSnapshotTest, LinkEscapingTheRepoFolderIsRefusedNamingLinkAndTarget) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  WriteAll(dir / "outside.json", "{}");
  fs::create_symlink("../../../../outside.json", hub.snapshot / "extra.json");
  absl::Status s = FingerprintStatus(hub.snapshot);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("extra.json -> ../../../../outside.json"));
  EXPECT_THAT(s.message(), HasSubstr("resolves to " + (dir / "outside.json").string()));
  EXPECT_THAT(s.message(), HasSubstr("outside the repository folder"));
}

TEST(HubSnapshotTest, AbsoluteLinkAndLinkThroughALinkedDirectoryAreRefused) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  fs::remove(hub.snapshot / "config.json");
  fs::create_symlink("/etc/hostname", hub.snapshot / "config.json");
  EXPECT_TRUE(absl::IsPermissionDenied(FingerprintStatus(hub.snapshot)));
  // blobs2 -> outside: a path that stays "inside" by name but leaves through a link.
  fs::remove(hub.snapshot / "config.json");
  fs::create_directory(dir / "elsewhere");
  WriteAll(dir / "elsewhere" / "x", "{}");
  fs::create_directory_symlink(dir / "elsewhere", hub.repo / "blobs2");
  fs::create_symlink("../../blobs2/x", hub.snapshot / "config.json");
  absl::Status s = FingerprintStatus(hub.snapshot);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("config.json -> ../../blobs2/x"));
}

TEST(HubSnapshotTest, AllowListAppliesToLinkTargets) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  LinkOptions daemon;
  daemon.allowed = {hub.snapshot.string()};  // the root is allowed, its blobs are not
  absl::Status s = FingerprintStatus(hub.snapshot, daemon);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("outside the allowed roots"));
  daemon.allowed = {hub.repo.string()};
  EXPECT_EQ(RootOf(hub.snapshot, daemon), RootOf(Fixture("mini-kimi-mxfp4")));
}

TEST(HubSnapshotTest, LinkToADirectoryOrLoopIsRefused) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  fs::create_symlink("../../blobs", hub.snapshot / "d");
  EXPECT_TRUE(absl::IsPermissionDenied(FingerprintStatus(hub.snapshot)));
  fs::remove(hub.snapshot / "d");
  fs::create_symlink("loop", hub.snapshot / "loop");
  absl::Status s = FingerprintStatus(hub.snapshot);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("too many links"));
}

TEST(HubSnapshotTest, TamperedBlobsAreFlagged) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  // One LFS blob (SHA-256 name) and one small file's blob (git blob id name).
  const std::string shard = testing::HubBlobName(Fixture("mini-kimi-mxfp4/model-00002-of-00002.safetensors"));
  const std::string config = testing::HubBlobName(Fixture("mini-kimi-mxfp4/config.json"));
  std::vector<uint8_t> bytes = testing::ReadAll(hub.repo / "blobs" / shard);
  bytes.back() ^= 1;
  WriteAll(hub.repo / "blobs" / shard, bytes);
  Checked c = CheckDir(hub.snapshot);
  ASSERT_EQ(Codes(c.findings, true), std::vector<std::string>{"blob-digest-mismatch"});
  EXPECT_THAT(c.findings[0].message, HasSubstr("model-00002-of-00002.safetensors: blob " + shard));
  std::string text(testing::ReadAll(hub.repo / "blobs" / config).size(), ' ');
  WriteAll(hub.repo / "blobs" / config, text);  // same size, other bytes
  c = CheckDir(hub.snapshot);
  EXPECT_EQ(Codes(c.findings, true).size(), 2u);
  EXPECT_THAT(c.findings[0].message, HasSubstr("config.json: blob " + config));
  EXPECT_THAT(c.findings[0].message, HasSubstr("git blob id"));
}

TEST(HubSnapshotTest, LinkRetargetedAfterTheReadIsDataLoss) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  auto listing = ListLayout(hub.snapshot.string());
  ASSERT_TRUE(listing.ok()) << listing.status();
  ReadOptions read;
  read.keep = ReadOptions::Keep::kNothing;
  auto image = ReadTree(std::move(listing->listing), read, NoProgress());
  ASSERT_TRUE(image.ok()) << image.status();
  ASSERT_TRUE((*image)->CheckUnchanged().ok());
  // Another blob of the same repo: still confined, but not what was read.
  const std::string other = testing::HubBlobName(Fixture("mini-kimi-mxfp4/model.safetensors.index.json"));
  fs::remove(hub.snapshot / "config.json");
  fs::create_symlink("../../blobs/" + other, hub.snapshot / "config.json");
  absl::Status s = (*image)->CheckUnchanged();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("config.json: symbolic link changed after it was followed"));
}

TEST(HubSnapshotTest, RefsMainOnAnotherCommitIsRecorded) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  WriteAll(hub.repo / "refs" / "main", kOtherCommit);
  Checked c = CheckDir(hub.snapshot);
  EXPECT_EQ(c.layout.commit, kCommit);
  EXPECT_EQ(c.layout.refs_main, kOtherCommit);
  EXPECT_TRUE(c.findings.empty());
}

TEST(LocalDirTest, CacheFolderLeftOutAndRecordedInIgnorePaths) {
  TempDir dir;
  fs::path local = testing::MakeLocalDir("mini-kimi-nvfp4", dir / "local", kCommit);
  EXPECT_EQ(RootOf(local), RootOf(Fixture("mini-kimi-nvfp4")));
  FingerprintOptions o;
  o.tensor_digests = false;
  auto fp = FingerprintTree(local.string(), o, NoProgress());
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_THAT(fp->manifest.ignore_paths, ::testing::Contains(".cache/huggingface"));
  EXPECT_EQ(fp->files.size(), 4u);
  Checked c = CheckDir(local);
  EXPECT_EQ(c.layout.kind, TreeLayout::kLocalDir);
  EXPECT_EQ(c.layout.ModelRef(), kCommit);
  EXPECT_TRUE(c.findings.empty()) << c.findings.front().message;
}

TEST(LocalDirTest, EtagMismatchIsFlagged) {
  TempDir dir;
  fs::path local = testing::MakeLocalDir("mini-kimi-nvfp4", dir / "local", kCommit);
  std::vector<uint8_t> bytes = testing::ReadAll(local / "model-00001-of-00002.safetensors");
  bytes.back() ^= 0x80;
  WriteAll(local / "model-00001-of-00002.safetensors", bytes);
  WriteAll(local / "config.json", std::string("{\"edited\": true}\n"));
  Checked c = CheckDir(local);
  ASSERT_EQ(Codes(c.findings, true), (std::vector<std::string>{"etag-mismatch", "etag-mismatch"}));
  EXPECT_THAT(c.findings[0].message, HasSubstr("config.json: git blob id"));
  EXPECT_THAT(c.findings[1].message, HasSubstr("model-00001-of-00002.safetensors: SHA-256"));
  EXPECT_THAT(c.findings[1].message, ::testing::Not(HasSubstr("git blob id")));
}

TEST(LocalDirTest, MixedCommitsFlaggedAndMissingMetadataReported) {
  TempDir dir;
  fs::path local = testing::MakeLocalDir("mini-kimi-nvfp4", dir / "local", kCommit);
  const std::string etag = testing::HubBlobName(local / "config.json");
  WriteAll(testing::MetadataOf(local, "config.json"),
           std::string(kOtherCommit) + "\n" + etag + "\n1764460900.5\n");
  fs::remove(testing::MetadataOf(local, "model.safetensors.index.json"));
  Checked c = CheckDir(local);
  EXPECT_EQ(Codes(c.findings, true), std::vector<std::string>{"mixed-commits"});
  EXPECT_EQ(Codes(c.findings, false),
            (std::vector<std::string>{"no-download-metadata", "mixed-commits"}));
  EXPECT_EQ(c.layout.ModelRef(), "");  // no one commit to name
}

TEST(GenericLinksTest, RefusedByDefaultFollowedWhenAllowedAndConfined) {
  TempDir dir;
  fs::path root = testing::CopyFixture("mini-kimi-mxfp4", dir);
  const std::string plain = RootOf(root);
  fs::create_directory(dir / "store");
  fs::rename(root / "config.json", dir / "store" / "config.json");
  fs::create_symlink("../store/config.json", root / "config.json");
  absl::Status s = FingerprintStatus(root);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("symbolic link refused"));
  LinkOptions allow;
  allow.allow_symlinks = true;
  s = FingerprintStatus(root, allow);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("config.json -> ../store/config.json: resolves to " +
                                     (dir / "store" / "config.json").string()));
  allow.confine = {(dir / "store").string()};
  EXPECT_EQ(RootOf(root, allow), plain);
  // A link inside the root is followed without --confine; the daemon's allow-list still applies.
  fs::rename(dir / "store" / "config.json", root / "real-config");
  fs::remove(root / "config.json");
  fs::create_symlink("real-config", root / "config.json");
  LinkOptions inside;
  inside.allow_symlinks = true;
  inside.allowed = {(dir / "store").string()};
  s = FingerprintStatus(root, inside);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("outside the allowed roots"));
  inside.allowed = {dir.path().string()};
  EXPECT_TRUE(FingerprintStatus(root, inside).ok());
}

// A link into another snapshot and a blob named by no digest are listed, never failing
// (docs/rules.md: link-not-to-blob, blob-name-unchecked).
TEST(HubSnapshotTest, LinkOutsideBlobsAndUnnamedBlobAreReportedNotFailing) {
  TempDir dir;
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir / "hub", "org/m", kCommit);
  EXPECT_TRUE(CheckDir(hub.snapshot).findings.empty());
  fs::copy_file(hub.snapshot / "config.json", hub.repo / "blobs" / "not-a-digest");
  fs::remove(hub.snapshot / "config.json");
  fs::create_symlink("../../blobs/not-a-digest", hub.snapshot / "config.json");
  fs::create_directories(hub.repo / "snapshots" / "other");
  fs::copy_file(hub.snapshot / "model.safetensors.index.json",
                hub.repo / "snapshots" / "other" / "model.safetensors.index.json");
  fs::remove(hub.snapshot / "model.safetensors.index.json");
  fs::create_symlink("../other/model.safetensors.index.json",
                     hub.snapshot / "model.safetensors.index.json");
  Checked c = CheckDir(hub.snapshot);
  EXPECT_TRUE(Codes(c.findings, true).empty());
  EXPECT_THAT(Codes(c.findings, false),
              ::testing::UnorderedElementsAre("blob-name-unchecked", "link-not-to-blob"));
}

// Download metadata that is not three lines, and an etag that is no digest, are listed, never
// failing (docs/rules.md: download-metadata-unreadable, etag-unchecked).
TEST(LocalDirTest, UnreadableMetadataAndUncheckableEtagAreReportedNotFailing) {
  TempDir dir;
  fs::path local = testing::MakeLocalDir("mini-kimi-nvfp4", dir / "local", kCommit);
  EXPECT_TRUE(CheckDir(local).findings.empty());
  WriteAll(testing::MetadataOf(local, "config.json"), std::string("one line only\n"));
  WriteAll(testing::MetadataOf(local, "model.safetensors.index.json"),
           std::string(kCommit) + "\nnot-a-digest\n1764460800.25\n");
  Checked c = CheckDir(local);
  EXPECT_TRUE(Codes(c.findings, true).empty());
  EXPECT_THAT(Codes(c.findings, false),
              ::testing::UnorderedElementsAre("download-metadata-unreadable", "etag-unchecked"));
}

}  // namespace
}  // namespace ckpt
