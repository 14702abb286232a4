// Reading behind the cursor (docs/audit-engine.md): an NVFP4 shard written as the reference
// writer orders it stores every scale before every packed weight. When those scales take more
// than half the window, the cursor hashes them without holding them and each is read again
// when its packed weight arrives, checked against the cursor's hash.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <filesystem>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>
#include <string>

#include "bench/scale/scale_checkpoint.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/record.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/audit/fault_fs.h"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::FaultDirectory;
using ::ckpt::testing::ReadHook;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::TreeBytes;
using ::testing::HasSubstr;

// One Kimi-K3-shaped MoE layer of 64 small experts in one shard per tree: 1.1 MiB of NVFP4
// scales ahead of the packed weights, about 250 KiB of headers (raw and parsed) per tree.
constexpr uint64_t kWindow = 1536ull << 10;

bench::ScaleOptions Layer(bench::ScaleFormat format, uint64_t vocab = 0) {
  bench::ScaleOptions o;
  o.geometry = {bench::ScaleFamily::kKimiK3, 256, 256, 384, 64, 4, 1, 1, 0, vocab};
  o.seed = 11;
  o.threads = 2;
  o.format = format;
  return o;
}

// The signed statement, less what depends on the run and the window: times, the bytes read
// and read again.
std::string Statements(const evidence::EvidenceRecord& r) {
  evidence::EvidenceRecord copy = r;
  copy.started_at = copy.finished_at = "";
  for (evidence::CheckResult& c : copy.checks) {
    for (const char* count : {"bytes_read", "reread_tensors", "reread_bytes"}) {
      c.counts.erase(count);
    }
  }
  auto payload = evidence::RecordPayload(copy);
  EXPECT_TRUE(payload.ok()) << payload.status();
  return payload.ok() ? *payload : "";
}

class ReadBehindTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp_ / "src").string(),
                                            Layer(bench::ScaleFormat::kMxfp4)).ok());
    ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp_ / "dst").string(),
                                            Layer(bench::ScaleFormat::kNvfp4)).ok());
    for (const auto& e : fs::directory_iterator(tmp_ / "dst")) {
      if (e.path().extension() == ".safetensors") shard_ = e.path();
    }
    ASSERT_FALSE(shard_.empty());
  }

  AuditOptions Options(uint64_t window) {
    AuditOptions o;
    o.root = (tmp_ / "dst").string();
    o.source = (tmp_ / "src").string();
    o.memory_window = window;
    o.threads = 3;
    return o;
  }

  // Where the derived shard's last scale starts and where its scales end.
  std::pair<uint64_t, uint64_t> Scales() const {
    const std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard_);
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | bytes[i];
    const auto json = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header);
    uint64_t last = 0, end = 0;
    for (const auto& [name, t] : json.items()) {
      if (name.find("weight_scale") == std::string::npos) continue;
      last = std::max(last, 8 + header + t["data_offsets"][0].get<uint64_t>());
      end = std::max(end, 8 + header + t["data_offsets"][1].get<uint64_t>());
    }
    return {last, end};
  }

  TempDir tmp_;
  fs::path shard_;
};

TEST_F(ReadBehindTest, ScalesAheadOfTheirPackedWeightsAuditInAWindowSmallerThanThem) {
  AuditStats small, large;
  auto bounded = RunAudit(Options(kWindow), NoProgress(), &small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  auto unbounded = RunAudit(Options(1ull << 32), NoProgress(), &large);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_EQ(bounded->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_EQ(Statements(*bounded), Statements(*unbounded));
  EXPECT_LE(small.peak_kept_bytes, kWindow);

  // Every byte once, and the derived scales (a ninth of its quantized bytes) a second time.
  const uint64_t tree_bytes = TreeBytes(tmp_ / "src") + TreeBytes(tmp_ / "dst");
  EXPECT_EQ(large.bytes_read, tree_bytes);
  EXPECT_GT(small.bytes_read, tree_bytes + kWindow / 2);
  EXPECT_LT(small.bytes_read, tree_bytes + TreeBytes(tmp_ / "dst") / 8);
}

// A scale rewritten after the cursor hashed it and before it is read again: the second read
// does not match the hash, and no record is made.
TEST_F(ReadBehindTest, ScaleChangedBeforeItsSecondReadIsDataLoss) {
  const std::vector<uint8_t> original = ::ckpt::testing::ReadAll(shard_);
  const auto [scale_at, scales_end] = Scales();
  ASSERT_GT(scales_end, scale_at);
  // The first read past the last scale is the cursor's, among the packed weights: every scale
  // has been hashed, and each is read again only once the cursor has reached its packed weight.
  std::atomic<bool> rewritten = false;
  ReadHook hook{shard_.filename().string(), [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t) {
    if (offset < scales_end || rewritten.exchange(true)) return;
    // One byte in place: the cursor and a second read may be reading the file meanwhile.
    const uint8_t flipped = original[scale_at] ^ 0x01;
    int fd = ::open(shard_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(scale_at)), 1);
    ::close(fd);
  };
  AuditOptions o = Options(kWindow);
  o.root_dir = FaultDirectory::Open(o.root, std::move(hook));
  auto rec = RunAudit(o, NoProgress());
  EXPECT_TRUE(rewritten);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(std::string(rec.status().message()), HasSubstr("second read"));
  EXPECT_THAT(std::string(rec.status().message()), HasSubstr(shard_.filename().string()));
}

// A scale the cursor hashed stays in the page cache until its second read: dropping it as the
// cursor passes would make that second read one from storage (docs/audit-engine.md).
TEST_F(ReadBehindTest, AScaleReadAgainIsNotDroppedFromThePageCacheBeforeItsSecondRead) {
  struct Event {
    bool read;
    uint64_t begin, end;
  };
  std::mutex mu;
  std::vector<Event> events;
  ReadHook hook{shard_.filename().string(), [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({true, offset, offset + length});
  };
  hook.consumed = [&](uint64_t offset, uint64_t length) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({false, offset, offset + length});
  };
  AuditOptions o = Options(kWindow);
  o.root_dir = FaultDirectory::Open(o.root, std::move(hook));
  auto rec = RunAudit(o, NoProgress());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->OverallVerdict(), evidence::Verdict::kPass);

  // Each byte read twice: between its first and its last read, no drop covers it.
  std::vector<std::pair<uint64_t, uint64_t>> reread;
  for (size_t i = 0; i < events.size(); ++i) {
    if (!events[i].read) continue;
    for (size_t j = 0; j < i; ++j) {
      const Event& e = events[j];
      if (e.read && e.begin < events[i].end && events[i].begin < e.end) {
        const uint64_t a = std::max(e.begin, events[i].begin), b = std::min(e.end, events[i].end);
        for (size_t k = j + 1; k < i; ++k) {
          const Event& d = events[k];
          EXPECT_FALSE(!d.read && d.begin < b && a < d.end)
              << "bytes [" << a << ", " << b << ") were dropped after their first read and "
              << "before their second";
        }
        reread.push_back({a, b});
        break;
      }
    }
  }
  EXPECT_FALSE(reread.empty()) << "the window should make the audit read scales twice";
}

// A scale read again does not stop the cursor: the second read runs beside it, on another
// thread (docs/audit-engine.md, "Reading behind the cursor"). Second reads wait, in the file
// system, for the cursor to read further (up to 100 ms each, for the first 100 of them, until
// once it has): before, the cursor waited for them, every time. The window may leave the
// cursor nothing to read during one such wait, never during all of them.
TEST_F(ReadBehindTest, TheCursorKeepsReadingWhileAScaleIsReadAgain) {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t furthest = 0;  // the end of the furthest read so far
  int tried = 0;
  bool waiting = false, moved = false;
  ReadHook hook{shard_.filename().string(), [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    std::unique_lock<std::mutex> lock(mu);
    if (offset + length > furthest) {
      if (waiting) moved = true;
      furthest = offset + length;
      cv.notify_all();
      return;
    }
    if (moved || tried == 100) return;
    ++tried;  // a read behind what has been read: a scale read again
    waiting = true;
    cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return moved; });
    waiting = false;
  };
  AuditOptions o = Options(kWindow);
  o.root_dir = FaultDirectory::Open(o.root, std::move(hook));
  auto rec = RunAudit(o, NoProgress());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_GT(tried, 0) << "the window should make the audit read scales twice";
  EXPECT_TRUE(moved) << "the cursor did not read on while a scale was read again";
}

// Progress counts each byte of the files once: a scale read again is not counted again, so
// "100%" means the last byte has been read (it used to be reached while the second reads'
// bytes were still to come).
TEST_F(ReadBehindTest, ProgressEndsAtTheFilesSizeAlthoughScalesAreReadTwice) {
  class Phases final : public Progress {
   public:
    void Begin(std::string_view phase, uint64_t total) override {
      std::lock_guard<std::mutex> lock(mu_);
      phases_.push_back({std::string(phase), total, 0});
    }
    void Advance(uint64_t n) override {
      std::lock_guard<std::mutex> lock(mu_);
      std::get<2>(phases_.back()) += n;
    }
    void End() override {}
    std::vector<std::tuple<std::string, uint64_t, uint64_t>> phases_;

   private:
    std::mutex mu_;
  } progress;
  AuditStats stats;
  auto rec = RunAudit(Options(kWindow), progress, &stats);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_GT(stats.bytes_read, TreeBytes(tmp_ / "src") + TreeBytes(tmp_ / "dst"));  // read twice
  // The last phase is the stream's: the tensor data of both trees, after their headers.
  ASSERT_FALSE(progress.phases_.empty());
  const auto& [phase, total, done] = progress.phases_.back();
  EXPECT_GT(total, TreeBytes(tmp_ / "dst")) << phase;
  EXPECT_EQ(done, total) << phase;
}

// Embeddings and head of 4096 x 256 BF16 (2 MiB each, on each side) are larger than the window:
// the pair check compares them by the SHA-256 the cursor takes as they pass, holding neither,
// and still finds one changed byte.
TEST(ReadWithoutHoldingTest, TensorsLargerThanTheWindowAreComparedByDigest) {
  TempDir tmp;
  ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp / "src").string(),
                                          Layer(bench::ScaleFormat::kMxfp4, 4096)).ok());
  ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp / "dst").string(),
                                          Layer(bench::ScaleFormat::kNvfp4, 4096)).ok());
  AuditOptions o;
  o.root = (tmp / "dst").string();
  o.source = (tmp / "src").string();
  o.memory_window = kWindow;
  AuditStats stats;
  auto rec = RunAudit(o, NoProgress(), &stats);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_LE(stats.peak_kept_bytes, kWindow);
  ASSERT_TRUE(rec->pair_audit.has_value());
  EXPECT_GE(rec->pair_audit->ignored_bytes_compared, 2 * (4096u * 256 * 2));

  fs::path shard;
  for (const auto& e : fs::directory_iterator(tmp / "dst")) {
    if (e.path().extension() == ".safetensors") shard = e.path();
  }
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | bytes[i];
  const auto json = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header);
  const std::string embed = "language_model.model.embed_tokens.weight";
  ASSERT_TRUE(json.contains(embed)) << json.dump().substr(0, 400);
  bytes[8 + header + json[embed]["data_offsets"][0].get<uint64_t>() + 1000] ^= 0x01;
  ::ckpt::testing::WriteAll(shard, bytes);
  auto changed = RunAudit(o, NoProgress());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->OverallVerdict(), evidence::Verdict::kFail);
  ASSERT_TRUE(changed->pair_audit.has_value());
  EXPECT_EQ(changed->pair_audit->mismatches.by_code.at("ignored-tensor-differs"), 1u);
}

}  // namespace
}  // namespace ckpt::audit
