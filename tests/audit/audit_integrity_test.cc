// The one-pass audit under a hostile file system (docs/audit-engine.md): a file rewritten in
// place (mtime restored), renamed over, or truncated between two reads of an audit never gives
// a record; every byte is read from storage once; the source is bound by its digests; a
// malformed checkpoint is an error and no record.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "core/audit/audit_checks.h"
#include "core/fingerprint/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/audit/fault_fs.h"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::FaultDirectory;
using ::ckpt::testing::ReadHook;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::TreeBytes;
using ::testing::HasSubstr;

constexpr char kShard[] = "model-00001-of-00002.safetensors";

// Overwrites one byte near the end of `file` (inside the last tensor), keeping its size, and
// puts its modification time back: what an attacker does to slip bytes past an mtime check.
void RewriteInPlaceKeepingMtime(const fs::path& file) {
  struct stat before;
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  int fd = ::open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  uint8_t b = 0x77;
  ASSERT_EQ(::pwrite(fd, &b, 1, before.st_size - 5), 1);
  ::close(fd);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  struct stat after;
  ASSERT_EQ(::stat(file.c_str(), &after), 0);
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  ASSERT_EQ(after.st_size, before.st_size);
}

class AuditIntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = CopyFixture("mini-kimi-mxfp4", tmp_);
    derived_ = CopyFixture("mini-kimi-nvfp4", tmp_);
  }

  absl::StatusOr<evidence::EvidenceRecord> PairAudit(ReadHook hook) {
    AuditOptions o;
    o.root = derived_.string();
    o.root_dir = FaultDirectory::Open(derived_.string(), std::move(hook));
    o.source = source_.string();
    return RunAudit(o, NoProgress());
  }

  TempDir tmp_;
  fs::path source_, derived_;
};

TEST_F(AuditIntegrityTest, HonestPairPassesReadingEveryByteOnce) {
  auto rec = PairAudit({kShard, [](int) {}});
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->OverallVerdict(), evidence::Verdict::kPass);
  const evidence::CheckResult& fp = rec->checks.front();
  ASSERT_EQ(fp.name, "fingerprint");
  EXPECT_EQ(static_cast<uint64_t>(fp.counts.at("bytes_read")),
            TreeBytes(source_) + TreeBytes(derived_));
}

TEST_F(AuditIntegrityTest, InPlaceRewriteWithRestoredMtimeDuringReadIsDataLoss) {
  // Read 1 is the length prefix, read 2 the header: the data is rewritten before it is read.
  auto rec = PairAudit({kShard, [&](int reads) {
                          if (reads == 2) RewriteInPlaceKeepingMtime(derived_ / kShard);
                        }});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(rec.status().message(), HasSubstr(kShard));
}

TEST_F(AuditIntegrityTest, InPlaceRewriteAfterTheReadIsDataLoss) {
  // The last read of the file (one byte past its end) has happened: the checks run on the
  // bytes read, and the end-of-audit re-stat (ctime) catches the rewrite.
  auto rec = PairAudit({kShard, [&](int reads) {
                          if (reads == 4) RewriteInPlaceKeepingMtime(derived_ / kShard);
                        }});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(rec.status().message(), HasSubstr(kShard));
}

TEST_F(AuditIntegrityTest, RenameOverAfterTheReadIsDataLoss) {
  auto rec = PairAudit({kShard, [&](int reads) {
                          if (reads != 4) return;
                          fs::copy_file(derived_ / kShard, tmp_ / "replacement");
                          fs::rename(tmp_ / "replacement", derived_ / kShard);
                        }});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(rec.status().message(), HasSubstr(kShard));
}

TEST_F(AuditIntegrityTest, TruncationMidReadIsDataLossNamingFileAndOffset) {
  auto rec = PairAudit({kShard, [&](int reads) {
                          if (reads == 2) fs::resize_file(derived_ / kShard, 100000);
                        }});
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(rec.status().message(), HasSubstr(kShard));
  EXPECT_THAT(rec.status().message(), HasSubstr("offset 100000"));
}

TEST_F(AuditIntegrityTest, SourceIsBoundByContent) {
  auto rec = PairAudit({kShard, [](int) {}});
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_TRUE(rec->source.has_value());
  auto fp = FingerprintTree(source_.string(), {}, NoProgress());
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(rec->source->manifest_root, fp->manifest.RootHex());
  ASSERT_EQ(rec->source->files.size(), fp->files.size());
  for (size_t i = 0; i < fp->files.size(); ++i) {
    EXPECT_EQ(rec->source->files[i].name, fp->files[i].path);
    EXPECT_EQ(rec->source->files[i].sha256, ToHex(*fp->files[i].sha256));
  }
  auto payload = evidence::RecordPayload(*rec);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_THAT(*payload, HasSubstr(absl::StrCat("\"manifest_root\":\"", fp->manifest.RootHex())));
}

// A tree the strict reader refuses is not a checkpoint to judge (docs/audit-engine.md, "Not a
// checkpoint"): the audit is an error naming the file and why, as the root or as the source,
// and no record is made.
TEST_F(AuditIntegrityTest, MalformedCheckpointIsAnErrorNamingTheFileAndNoRecord) {
  for (const bool as_source : {false, true}) {
    TempDir tmp;
    const fs::path source = CopyFixture("mini-kimi-mxfp4", tmp);
    const fs::path derived = CopyFixture("mini-kimi-nvfp4", tmp);
    const fs::path bad = (as_source ? source : derived) / kShard;
    std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(bad);
    bytes[6] = 0x01;  // a header length prefix larger than the file
    ::ckpt::testing::WriteAll(bad, bytes);
    AuditOptions o;
    o.root = derived.string();
    o.source = source.string();
    auto rec = RunAudit(o, NoProgress());
    EXPECT_EQ(rec.status().code(), absl::StatusCode::kInvalidArgument) << rec.status();
    const std::string message(rec.status().message());
    EXPECT_THAT(message, HasSubstr(std::string(as_source ? "source: " : "") +
                                   "not a checkpoint the strict reader accepts: "));
    EXPECT_THAT(message, HasSubstr(fs::canonical(bad).string() + ": header too large"));
    EXPECT_THAT(message, HasSubstr("nothing was signed"));
  }
}

TEST_F(AuditIntegrityTest, OverTheMemoryWindowIsRefusedBeforeReading) {
  AuditOptions o;
  o.root = derived_.string();
  o.memory_window = 4096;
  auto rec = RunAudit(o, NoProgress());
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(AuditIntegrityTest, SymlinkSwappedInIsRefused) {
  fs::rename(derived_ / kShard, tmp_ / "elsewhere.safetensors");
  fs::create_symlink(tmp_ / "elsewhere.safetensors", derived_ / kShard);
  AuditOptions o;
  o.root = derived_.string();
  auto rec = RunAudit(o, NoProgress());
  ASSERT_FALSE(rec.ok());
  EXPECT_THAT(rec.status().message(), HasSubstr("symbolic link refused"));
}

}  // namespace
}  // namespace ckpt::audit
