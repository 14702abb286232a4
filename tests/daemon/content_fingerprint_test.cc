// The gate's fingerprinter: the same digests as the audit pipeline, metadata-only repeats, and
// the change detection the cache rests on (an in-place rewrite with the mtime put back is still
// seen, through ctime), symlinks refused, and cancellation between bounded reads.
#include "services/daemon/content_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/audit/audit_checks.h"
#include "core/fingerprint/fingerprint.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::TempDir;

// The fingerprinter works on an opened root, as the gate does.
absl::StatusOr<Content> FingerprintPath(ContentFingerprinter& fp, const fs::path& root,
                                        Progress& progress) {
  auto dir = io::RealFileSystem().OpenRoot(root.string());
  if (!dir.ok()) return dir.status();
  return fp.Fingerprint(*std::move(dir), progress);
}

// Cancelled once `after` bytes were reported; counts what was reported.
class CancelAfter final : public Progress {
 public:
  explicit CancelAfter(uint64_t after) : after_(after) {}
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t units) override { seen_ += units; }
  void End() override {}
  bool Cancelled() const override { return seen_ >= after_; }
  uint64_t seen() const { return seen_; }

 private:
  const uint64_t after_;
  std::atomic<uint64_t> seen_{0};
};

TEST(ContentFingerprint, SameDigestsAndSubjectsAsTheAuditPipeline) {
  TempDir dir;
  fs::path root = CopyFixture("mini-kimi-nvfp4", dir);
  std::string real = fs::canonical(root).string();
  ContentFingerprinter fp;
  auto content = FingerprintPath(fp, real, NoProgress());
  ASSERT_TRUE(content.ok()) << content.status();
  auto reference = FingerprintTree(real, {}, NoProgress());
  ASSERT_TRUE(reference.ok());
  EXPECT_EQ(ToHex(content->manifest_root), reference->manifest.RootHex());
  auto want = audit::SubjectsOf(*reference);
  auto got = content->Subjects();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].sha256, want[i].sha256);
  }
  EXPECT_GT(content->hashed_bytes, 0u);
}

TEST(ContentFingerprint, UnchangedFilesCostMetadataOnly) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter fp(1, /*stable_age=*/absl::ZeroDuration());
  auto first = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(first.ok());
  auto second = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->hashed_bytes, 0u);
  EXPECT_EQ(second->manifest_root, first->manifest_root);
}

// The racily-clean rule: a file changed within the stable age is hashed again every time.
TEST(ContentFingerprint, RecentlyChangedFilesAreHashedAgain) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter fp(1, /*stable_age=*/absl::Hours(1));
  auto first = FingerprintPath(fp, root, NoProgress());
  auto second = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->hashed_bytes, first->hashed_bytes);
}

// The attack on an (inode, size, mtime) cache: rewrite bytes in place, keep the size, put the
// mtime back. ctime moves anyway, and the new digest is computed.
TEST(ContentFingerprint, InPlaceRewriteWithRestoredMtimeIsSeen) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter fp(1, /*stable_age=*/absl::ZeroDuration());
  auto before = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(before.ok());
  std::string shard = root + "/model-00002-of-00002.safetensors";
  struct stat st;
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char flipped = 0;
  ASSERT_EQ(::pread(fd, &flipped, 1, st.st_size - 1), 1);
  flipped ^= 1;
  ASSERT_EQ(::pwrite(fd, &flipped, 1, st.st_size - 1), 1);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
  struct stat now;
  ASSERT_EQ(::stat(shard.c_str(), &now), 0);
  ASSERT_EQ(now.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
  ASSERT_EQ(now.st_size, st.st_size);

  auto after = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(after.ok());
  EXPECT_GT(after->hashed_bytes, 0u);
  EXPECT_NE(after->manifest_root, before->manifest_root);
}

TEST(ContentFingerprint, SymlinkInTheTreeIsRefused) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  fs::create_symlink("/etc/hostname", root + "/notes.txt");
  ContentFingerprinter fp;
  auto content = FingerprintPath(fp, root, NoProgress());
  EXPECT_EQ(content.status().code(), absl::StatusCode::kInvalidArgument);
}

// Finding 6: a gate kept hashing after its client left. Hashing polls between 64 KiB reads: a
// 64 GiB sparse file is abandoned after the first reads once cancelled.
TEST(ContentFingerprint, CancellationStopsHashingWithinOneRead) {
  TempDir dir;
  fs::create_directory(dir / "huge");
  std::string root = fs::canonical(dir / "huge").string();
  {
    int fd = ::open((root + "/blob.bin").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 64ll << 30), 0);
    ::close(fd);
  }
  ContentFingerprinter fp(2);
  CancelAfter progress(1);
  auto content = FingerprintPath(fp, root, progress);
  EXPECT_EQ(content.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LE(progress.seen(), 2u * (64u << 10));  // at most one read per thread
}

// A burst of gates on content not hashed yet reads it once: calls that find a file being hashed
// by another call wait for its digest.
TEST(ContentFingerprint, ConcurrentCallsReadTheBytesOnce) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter alone(1, absl::ZeroDuration());
  auto reference = FingerprintPath(alone, root, NoProgress());
  ASSERT_TRUE(reference.ok());
  ContentFingerprinter fp(1, absl::ZeroDuration());
  constexpr int kCalls = 8;
  std::vector<absl::StatusOr<Content>> results(kCalls, absl::UnknownError("not run"));
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kCalls) std::this_thread::yield();
      results[i] = FingerprintPath(fp, root, NoProgress());
    });
  }
  for (auto& t : threads) t.join();
  uint64_t hashed = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->manifest_root, reference->manifest_root);
    hashed += r->hashed_bytes;
  }
  EXPECT_EQ(hashed, reference->hashed_bytes);
}

// Reports reads, and holds the hashing call in its first report until released; then cancelled.
class HeldThenCancelled final : public Progress {
 public:
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t) override {
    reading_ = true;
    while (!release_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void End() override {}
  bool Cancelled() const override { return release_; }
  std::atomic<bool> reading_{false}, release_{false};
};

// A call waiting for another's digest hashes the file itself when that call stops.
TEST(ContentFingerprint, WaitingCallHashesItselfWhenTheHashingCallStops) {
  TempDir dir;
  fs::create_directory(dir / "one");
  std::string root = fs::canonical(dir / "one").string();
  {
    int fd = ::open((root + "/blob.bin").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 1 << 20), 0);
    ::close(fd);
  }
  ContentFingerprinter alone(1, absl::ZeroDuration());
  auto reference = FingerprintPath(alone, root, NoProgress());
  ASSERT_TRUE(reference.ok());
  ContentFingerprinter fp(1, absl::ZeroDuration());
  HeldThenCancelled held;
  absl::StatusOr<Content> first = absl::UnknownError("not run");
  std::thread hashing([&] { first = FingerprintPath(fp, root, held); });
  for (int i = 0; i < 5000 && !held.reading_; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(held.reading_);
  absl::StatusOr<Content> second = absl::UnknownError("not run");
  std::thread waiting([&] { second = FingerprintPath(fp, root, NoProgress()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it find the hash under way
  held.release_ = true;
  hashing.join();
  waiting.join();
  EXPECT_EQ(first.status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->manifest_root, reference->manifest_root);
  EXPECT_EQ(second->hashed_bytes, uint64_t{1} << 20);
}

}  // namespace
}  // namespace ckpt::daemon
