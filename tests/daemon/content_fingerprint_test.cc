// The gate's fingerprinter: the same digests as the audit pipeline, every file read on every
// call (bytes changed behind an unchanged stat identity are seen), symlinks refused, and
// cancellation between bounded reads.
#include "services/daemon/content_fingerprint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/audit/audit_checks.h"
#include "core/fingerprint/fingerprint.h"
#include "gtest/gtest.h"
#include "tests/audit/fault_fs.h"
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
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = content->Subjects();
  ASSERT_EQ(got.size(), want->size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, (*want)[i].name);
    EXPECT_EQ(got[i].sha256, (*want)[i].sha256);
  }
  EXPECT_GT(content->hashed_bytes, 0u);
}

// No digest outlives its call: a repeat reads every byte again.
// A file named like a subject that names no file is refused, as the audit refuses it
// (docs/evidence.md, "Reserved names"), so a gate cannot match it against a record's binding.
TEST(ContentFingerprint, AFileNamedLikeAReservedSubjectIsRefused) {
  for (const char* name : {evidence::kOciManifestSubject, evidence::kManifestRootSubject}) {
    TempDir dir;
    fs::path root = CopyFixture("mini-kimi-nvfp4", dir);
    ckpt::testing::WriteAll(root / name, "{}");
    ContentFingerprinter fp;
    auto content = FingerprintPath(fp, root, NoProgress());
    EXPECT_EQ(content.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(content.status().message().find(std::string("/") + name + ": a file may not"),
              std::string::npos)
        << content.status();
  }
}

TEST(ContentFingerprint, EveryCallReadsEveryFile) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(root)) total += fs::file_size(e.path());
  ContentFingerprinter fp(1);
  auto first = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(first.ok());
  auto second = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->hashed_bytes, total);
  EXPECT_EQ(second->hashed_bytes, total);
  EXPECT_EQ(second->manifest_root, first->manifest_root);
}

// Rewrite bytes in place, keep the size, put the mtime back: the new digest is computed.
TEST(ContentFingerprint, InPlaceRewriteWithRestoredMtimeIsSeen) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter fp(1);
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

// Issue 21, finding 1: on ext4 a second write through an already-dirtied shared mapping changes
// neither mtime nor ctime, and a gate that reused a digest by (device, inode, size, mtime,
// ctime) kept answering for the old bytes. The seam reports one frozen identity for the shard,
// its ctime an hour old, whatever happens to it, so the case does not depend on the kernel's
// timestamp rules: a byte set to 0xFF through the mapping must still change the digest, and
// the digests must be those of the bytes on disk now.
TEST(ContentFingerprint, BytesWrittenThroughASharedMappingAreSeenWhateverTheIdentity) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-mxfp4", dir)).string();
  const std::string name = "model-00002-of-00002.safetensors";
  std::mutex mu;
  std::optional<io::FileIdentity> frozen;
  ckpt::testing::ReadHook hook{name, [](int) {}};
  hook.identity = [&](const io::FileIdentity& real) {
    std::lock_guard<std::mutex> lock(mu);
    if (!frozen) {
      frozen = real;
      frozen->mtime_ns -= 3600'000'000'000;
      frozen->ctime_ns -= 3600'000'000'000;
    }
    return *frozen;
  };
  std::shared_ptr<const io::Directory> seam = ckpt::testing::FaultDirectory::Open(root, hook);
  ASSERT_NE(seam, nullptr);

  const std::string shard = root + "/" + name;
  int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  const size_t size = static_cast<size_t>(st.st_size);
  auto* map = static_cast<uint8_t*>(
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(map, MAP_FAILED);
  const size_t at = size - 1;
  map[at] = map[at];  // the first write dirties the page (and moves the times, once)
  ASSERT_EQ(::msync(map, size, MS_SYNC), 0);

  ContentFingerprinter fp(1);
  auto before = fp.Fingerprint(seam, NoProgress());
  ASSERT_TRUE(before.ok()) << before.status();
  map[at] = map[at] == 0xFF ? 0x00 : 0xFF;  // the second, through the same mapping
  ASSERT_EQ(::msync(map, size, MS_SYNC), 0);
  ::munmap(map, size);
  ::close(fd);

  auto after = fp.Fingerprint(seam, NoProgress());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(after->hashed_bytes, 0u);
  EXPECT_NE(after->manifest_root, before->manifest_root);
  auto now = FingerprintTree(root, {}, NoProgress());
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(ToHex(after->manifest_root), now->manifest.RootHex());
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

// Concurrent calls each read the tree and agree.
TEST(ContentFingerprint, ConcurrentCallsAgree) {
  TempDir dir;
  std::string root = fs::canonical(CopyFixture("mini-kimi-nvfp4", dir)).string();
  ContentFingerprinter fp(1);
  auto reference = FingerprintPath(fp, root, NoProgress());
  ASSERT_TRUE(reference.ok());
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
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->manifest_root, reference->manifest_root);
    EXPECT_EQ(r->hashed_bytes, reference->hashed_bytes);
  }
}

}  // namespace
}  // namespace ckpt::daemon
