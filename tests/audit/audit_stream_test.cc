// The streamed audit in a bounded memory window (docs/audit-engine.md, "Memory"): a pair far
// larger than the window gives the same record as an unbounded run and as the checks run on
// whole trees, holds at most the window, reads each byte once; a layout whose partner tensors
// lie far apart is RESOURCE_EXHAUSTED instead of growth; shards that store packed weights far
// from their scales audit in a small window by reading the scales ahead, with the digests of
// the stored files, and a rewrite between a read-ahead and the cursor's hash is DATA_LOSS, as
// is a file that shrinks in the middle of a step; a cancelled audit stops. Hashing behind the
// reads (transcode), a change, a cut, a moved identity or an I/O error between the work's read
// and the hashing cursor's is an error, never a digest of bytes no work read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "core/audit/audit_checks.h"
#include "core/audit/pair_check.h"
#include "core/checkpoint.h"
#include "core/fingerprint/fingerprint.h"
#include "core/git_blob_sha1.h"
#include "core/io/tree_stream.h"
#include "core/io/tree_walk.h"
#include "core/quant/pair_verify.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/scale_window.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
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

constexpr uint64_t kSmallWindow = 1ull << 20;
constexpr char kShard[] = "model-00001-of-00002.safetensors";

// Writes `value` at `offset` of `file` in place (same inode, as a rewrite by another process).
void OverwriteByte(const fs::path& file, uint64_t offset, uint8_t value) {
  int fd = ::open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << file;
  ASSERT_EQ(::pwrite(fd, &value, 1, static_cast<off_t>(offset)), 1) << file;
  ::close(fd);
}

// DATA_LOSS (so not OK) whose message names each of `parts`.
::testing::AssertionResult IsDataLossNaming(const absl::Status& s,
                                            std::initializer_list<absl::string_view> parts) {
  if (s.code() != absl::StatusCode::kDataLoss) {
    return ::testing::AssertionFailure() << "not DATA_LOSS: " << s;
  }
  for (absl::string_view part : parts) {
    if (!absl::StrContains(s.message(), part)) {
      return ::testing::AssertionFailure() << "does not name '" << part << "': " << s;
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr char kScale[] = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight_scale";
// What the layout with packed weights far from their scales needs when the scales are read
// ahead: the largest work item (512 KiB) beside the small files and headers with their parsed
// entries (about 340 KiB for the pair). Front to back, every packed weight of a shard is held
// until its scale arrives: over 896 KiB beside the same headers, more than this window.
constexpr uint64_t kPackedWindow = 1ull << 20;

// Rewrites a safetensors file with its tensors' data in the order `rank` gives (ascending,
// by name among equal ranks); the header keeps every tensor, at its new offsets.
void RewriteTensorOrder(const fs::path& file,
                        const std::function<int64_t(const nlohmann::json& tensor,
                                                    uint64_t begin)>& rank) {
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + n);
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (const auto& [name, t] : header.items()) {
    if (name != "__metadata__") sorted.push_back({rank(t, t["data_offsets"][0].get<uint64_t>()), name});
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint8_t> data;
  for (const auto& [r, name] : sorted) {
    const uint64_t begin = header[name]["data_offsets"][0].get<uint64_t>();
    const uint64_t end = header[name]["data_offsets"][1].get<uint64_t>();
    const uint64_t at = data.size();
    data.insert(data.end(), bytes.begin() + 8 + n + begin, bytes.begin() + 8 + n + end);
    header[name]["data_offsets"] = {at, data.size()};
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');
  std::vector<uint8_t> out(8);
  const uint64_t len = json.size();
  std::memcpy(out.data(), &len, 8);
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), data.begin(), data.end());
  ::ckpt::testing::WriteAll(file, out);
}

// Its tensors' data in reverse order (a valid file whose tensors now lie opposite to their
// partners in the other tree).
void ReverseTensorOrder(const fs::path& file) {
  RewriteTensorOrder(file, [](const nlohmann::json&, uint64_t begin) {
    return -static_cast<int64_t>(begin);
  });
}

// Its tensors' data grouped by dtype, by name within a dtype: BF16 first (where the source
// stores its BF16 tensors too), then the packed U8 weights, then the F8_E4M3 scales, then F32
// (the NVFP4 global scales): the reference writer's order for the quantized tensors
// (core/quant/safetensors_writer.cc) reversed, so that every packed weight lies far from its
// scales, at the opposite end of the quantized tensors.
void PackedBeforeScales(const fs::path& file) {
  const std::vector<std::string> order = {"BF16", "U8", "F8_E4M3", "F32"};
  RewriteTensorOrder(file, [&](const nlohmann::json& t, uint64_t) {
    const auto rank = std::find(order.begin(), order.end(), t["dtype"].get<std::string>());
    EXPECT_NE(rank, order.end()) << t.dump();
    return static_cast<int64_t>(rank - order.begin());
  });
}

// The parts of a record that say something about the checkpoints (not when it was made).
std::string Statements(const evidence::EvidenceRecord& r) {
  nlohmann::ordered_json j;
  for (const auto& s : r.subjects) j["subjects"].push_back({s.name, s.sha256});
  for (const auto& c : r.checks) {
    nlohmann::ordered_json counts = nlohmann::ordered_json::object();
    for (const auto& [k, v] : c.counts) counts[k] = v;
    nlohmann::ordered_json check;
    check["name"] = c.name;
    check["verdict"] = static_cast<int>(c.verdict);
    check["counts"] = counts;
    check["findings"] = nlohmann::ordered_json::array();
    check["findings"] = nlohmann::ordered_json::array();
    for (const auto& f : c.findings) {
      check["findings"].push_back({f.code, f.message, f.status, f.path, f.tensor, f.hazard,
                                   f.row.value_or(-1), f.group.value_or(-1), f.layer.value_or(-1),
                                   f.numbers, f.fails.value_or(false)});
    }
    check["findings_total"] = c.findings_total.value_or(0);
    check["json"] = c.ToJson();  // its series and details
    j["checks"].push_back(check);
  }
  if (r.source) {
    j["source"] = {r.source->root, r.source->manifest_root};
    for (const auto& f : r.source->files) j["source_files"].push_back({f.name, f.sha256});
  }
  if (r.pair_audit) j["pair_audit"] = r.pair_audit->ToJson();
  return j.dump();
}

const evidence::CheckResult& CheckNamed(const evidence::EvidenceRecord& r, const std::string& n) {
  for (const auto& c : r.checks) {
    if (c.name == n) return c;
  }
  ADD_FAILURE() << "no check " << n;
  return r.checks.front();
}

class AuditStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = CopyFixture("mini-kimi-mxfp4", tmp_);
    derived_ = CopyFixture("mini-kimi-nvfp4", tmp_);
  }

  absl::StatusOr<evidence::EvidenceRecord> Audit(uint64_t window, Progress& progress,
                                                 AuditStats* stats = nullptr) {
    AuditOptions o;
    o.root = derived_.string();
    o.source = source_.string();
    o.memory_window = window;
    o.threads = 3;
    return RunAudit(o, progress, stats);
  }

  void PackDerivedBeforeScales() {
    for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
      PackedBeforeScales(derived_ / shard);
      ASSERT_GT(fs::file_size(derived_ / shard), 2 * kPackedWindow);
    }
  }

  // Every file subject of `r` has the SHA-256 of the file as stored now.
  void ExpectSubjectsAreTheStoredFiles(const evidence::EvidenceRecord& r) {
    auto fp = FingerprintTree(derived_.string(), {}, NoProgress());
    ASSERT_TRUE(fp.ok()) << fp.status();
    for (const FileFingerprint& f : fp->files) {
      const auto it = std::find_if(r.subjects.begin(), r.subjects.end(),
                                   [&](const evidence::Subject& s) { return s.name == f.path; });
      ASSERT_NE(it, r.subjects.end()) << f.path;
      EXPECT_EQ(it->sha256, ToHex(*f.sha256)) << f.path;
    }
  }

  TempDir tmp_;
  fs::path source_, derived_;
};

TEST_F(AuditStreamTest, PairLargerThanTheWindowGivesTheUnboundedRecordReadingEachByteOnce) {
  const uint64_t tree_bytes = TreeBytes(source_) + TreeBytes(derived_);
  ASSERT_GT(tree_bytes, 8 * kSmallWindow);  // the pair is many windows large
  AuditStats small, large;
  auto bounded = Audit(kSmallWindow, NoProgress(), &small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  auto unbounded = Audit(1ull << 32, NoProgress(), &large);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();

  EXPECT_EQ(bounded->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_EQ(Statements(*bounded), Statements(*unbounded));
  EXPECT_LE(small.peak_kept_bytes, kSmallWindow);
  EXPECT_GT(small.peak_kept_bytes, 0u);
  EXPECT_EQ(small.bytes_read, tree_bytes);
  EXPECT_EQ(large.bytes_read, tree_bytes);
  EXPECT_EQ(static_cast<uint64_t>(CheckNamed(*bounded, "fingerprint").counts.at("bytes_read")),
            tree_bytes);
}

TEST_F(AuditStreamTest, StreamedChecksEqualTheChecksOnWholeTrees) {
  auto rec = Audit(kSmallWindow, NoProgress());
  ASSERT_TRUE(rec.ok()) << rec.status();
  auto src = Checkpoint::Open(source_.string());
  auto dst = Checkpoint::Open(derived_.string());
  ASSERT_TRUE(src.ok() && dst.ok());
  auto pair = quant::VerifyPair(**src, **dst, {}, NoProgress());
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(rec->pair_audit.has_value());
  EXPECT_EQ(DumpJson(rec->pair_audit->ToJson()), DumpJson(PairAuditOf(*pair).ToJson()));
  auto window = quant::ScaleWindowPolicy().Check(**dst, NoProgress());
  ASSERT_TRUE(window.ok()) << window.status();
  const evidence::CheckResult& c = CheckNamed(*rec, "scale_window");
  EXPECT_EQ(c.details.String("verdict"), quant::VerdictName(window->verdict));
  EXPECT_EQ(c.counts.at("tensors"), static_cast<int64_t>(window->tensors.size()));
  EXPECT_EQ(c.counts.at("hazards"), static_cast<int64_t>(window->hazards.total()));
  EXPECT_EQ(c.counts.at("zero_groups_out_of_window"),
            static_cast<int64_t>(window->zero_groups_out_of_window));
}

TEST_F(AuditStreamTest, ChangedPackedByteIsFoundInABoundedWindow) {
  // One FP4 code flipped near the end of the derived shard: the streamed compare sees it.
  const fs::path shard = derived_ / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  auto before = Audit(kSmallWindow, NoProgress());
  ASSERT_TRUE(before.ok()) << before.status();
  auto dst = Checkpoint::Open(derived_.string());
  ASSERT_TRUE(dst.ok());
  auto t = (*dst)->Find("language_model.model.layers.2.block_sparse_moe.experts.1.w2.weight_packed");
  ASSERT_TRUE(t.has_value());
  bytes[t->file->data_start() + t->info->begin + 100] ^= 0x11;
  ::ckpt::testing::WriteAll(shard, bytes);
  auto rec = Audit(kSmallWindow, NoProgress());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(CheckNamed(*rec, "pair_verify").verdict, evidence::Verdict::kFail);
  EXPECT_NE(Statements(*rec), Statements(*before));
}

TEST_F(AuditStreamTest, PartnersFarApartAreReadAgainNotHeld) {
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    ReverseTensorOrder(derived_ / shard);
  }
  AuditStats large;
  auto whole = Audit(1ull << 32, NoProgress(), &large);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_EQ(large.reread_tensors, 0u);
  // Half the small window: the derived modules wait at the far end of their shards, so the
  // source's tensors the window cannot hold until then are hashed as the cursor passes them
  // and read again when their module is admitted. Same verdicts and digests; every re-read
  // counted, in the stats and in the record.
  AuditStats small;
  auto rec = Audit(kSmallWindow / 2, NoProgress(), &small);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_LE(small.peak_kept_bytes, kSmallWindow / 2);
  EXPECT_GT(small.reread_tensors, 0u);
  EXPECT_GT(small.reread_bytes, 0u);
  EXPECT_EQ(small.bytes_read, large.bytes_read + small.reread_bytes);
  const evidence::CheckResult& fp = CheckNamed(*rec, "fingerprint");
  EXPECT_EQ(static_cast<uint64_t>(fp.counts.at("reread_tensors")), small.reread_tensors);
  EXPECT_EQ(static_cast<uint64_t>(fp.counts.at("reread_bytes")), small.reread_bytes);
  EXPECT_EQ(static_cast<uint64_t>(fp.counts.at("bytes_read")), small.bytes_read);
  evidence::EvidenceRecord same = *rec;
  for (const char* count : {"bytes_read", "reread_tensors", "reread_bytes"}) {
    same.checks.front().counts.erase(count);
  }
  same.checks.front().counts["bytes_read"] = static_cast<int64_t>(large.bytes_read);
  EXPECT_EQ(Statements(same), Statements(*whole));
}

TEST_F(AuditStreamTest, PackedWeightsFarFromTheirScalesAuditInASmallWindow) {
  // Each packed weight lies far from its scale: its scale and global scale are read ahead of
  // the file's cursor, and the packed weights stream through a window much smaller than a
  // shard, with each byte still read once and the file hashed in order.
  PackDerivedBeforeScales();
  const uint64_t tree_bytes = TreeBytes(source_) + TreeBytes(derived_);
  AuditStats small, large;
  auto bounded = Audit(kPackedWindow, NoProgress(), &small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  auto unbounded = Audit(1ull << 32, NoProgress(), &large);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_EQ(bounded->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_EQ(Statements(*bounded), Statements(*unbounded));
  EXPECT_LE(small.peak_kept_bytes, kPackedWindow);
  EXPECT_EQ(small.bytes_read, tree_bytes);
  EXPECT_EQ(large.bytes_read, tree_bytes);

  // The record's digests are those of the files as stored, and the checks equal the checks on
  // whole trees.
  ExpectSubjectsAreTheStoredFiles(*bounded);
  auto src = Checkpoint::Open(source_.string());
  auto dst = Checkpoint::Open(derived_.string());
  ASSERT_TRUE(src.ok() && dst.ok());
  auto pair = quant::VerifyPair(**src, **dst, {}, NoProgress());
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(bounded->pair_audit.has_value());
  EXPECT_EQ(DumpJson(bounded->pair_audit->ToJson()), DumpJson(PairAuditOf(*pair).ToJson()));
}

TEST_F(AuditStreamTest, ChangedScaleReadAheadIsFound) {
  PackDerivedBeforeScales();
  // One FP8 block scale changed: the copy read ahead is what the compare and the digest see.
  const fs::path shard = derived_ / kShard;
  auto dst = Checkpoint::Open(derived_.string());
  ASSERT_TRUE(dst.ok());
  auto t = (*dst)->Find(kScale);
  ASSERT_TRUE(t.has_value());
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  bytes[t->file->data_start() + t->info->begin + 7] ^= 0x08;
  ::ckpt::testing::WriteAll(shard, bytes);
  auto rec = Audit(kPackedWindow, NoProgress());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(CheckNamed(*rec, "pair_verify").verdict, evidence::Verdict::kFail);
  ExpectSubjectsAreTheStoredFiles(*rec);
}

TEST_F(AuditStreamTest, FileRewrittenBetweenReadAheadAndHashIsDataLoss) {
  PackDerivedBeforeScales();
  auto dst = Checkpoint::Open(derived_.string());
  ASSERT_TRUE(dst.ok());
  auto t = (*dst)->Find(kScale);
  ASSERT_TRUE(t.has_value());
  const uint64_t scale_at = t->file->data_start() + t->info->begin;
  // The last packed weight of the shard, which lies before the scales.
  auto last = (*dst)->Find("language_model.model.layers.1.block_sparse_moe.experts.9.w3.weight_packed");
  ASSERT_TRUE(last.has_value());
  ASSERT_LT(last->info->end, t->info->begin);
  const uint64_t last_packed_at = last->file->data_start() + last->info->begin;
  std::atomic<bool> last_packed_read = false;  // the hook may run on two threads at once
  // Right after the scale is read ahead (the cursor is still among the packed weights), its
  // bytes are rewritten in place and the mtime put back. The checks and the digest use the
  // bytes read; the rewrite is found when the file is checked at its end (ctime), and no
  // record is made. The read-ahead runs on a thread of its own: on a busy machine the cursor
  // may pass the last packed weight first, and that audit (nothing rewritten) is run again.
  std::atomic<bool> rewritten = false;
  ReadHook hook{kShard, [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    if (offset <= last_packed_at && last_packed_at < offset + length) last_packed_read = true;
    if (rewritten || last_packed_read || offset > scale_at || offset + length <= scale_at) return;
    rewritten = true;
    struct stat before;
    ASSERT_EQ(::stat((derived_ / kShard).c_str(), &before), 0);
    std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(derived_ / kShard);
    bytes[scale_at] ^= 0x08;
    OverwriteByte(derived_ / kShard, scale_at, bytes[scale_at]);
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, (derived_ / kShard).c_str(), times, 0), 0);
  };
  AuditOptions o;
  o.root = derived_.string();
  o.source = source_.string();
  o.memory_window = kPackedWindow;
  o.threads = 3;
  absl::StatusOr<evidence::EvidenceRecord> rec;
  for (int attempt = 0; attempt < 10 && !rewritten; ++attempt) {
    last_packed_read = false;
    o.root_dir = FaultDirectory::Open(derived_.string(), hook);
    rec = RunAudit(o, NoProgress());
    if (!rewritten) ASSERT_TRUE(rec.ok()) << rec.status();
  }
  EXPECT_TRUE(rewritten);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss) << rec.status();
  EXPECT_THAT(std::string(rec.status().message()), HasSubstr(kShard));
}

// The shard of the mini checkpoint read for a stream: the listing through `hook`, the image
// with tensor data deferred to StreamTrees.
std::shared_ptr<const TreeImage> DeferredImage(const fs::path& root, ReadHook hook,
                                               const ReadOptions& read) {
  absl::StatusOr<TreeListing> listing =
      ListTree(FaultDirectory::Open(root.string(), std::move(hook)));
  EXPECT_TRUE(listing.ok()) << listing.status();
  if (!listing.ok()) return nullptr;
  for (TreeFile& f : listing->files) f.git_blob_id = f.path == kShard;
  absl::StatusOr<std::shared_ptr<const TreeImage>> image =
      ReadTree(*std::move(listing), read, NoProgress());
  EXPECT_TRUE(image.ok()) << image.status();
  return image.ok() ? *image : nullptr;
}

// Read options for which the mini checkpoint's shard (2.8 MB) is one step of 3 pieces: a 4 MiB
// read chunk.
ReadOptions OneStepRead() {
  ReadOptions read = Checkpoint::ReadOnly();
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.memory_window = 64ull << 20;
  read.threads = 2;
  return read;
}

// Every tensor digest of `f` is the SHA-256 of that tensor's bytes in `disk` (the whole file).
void ExpectTensorDigestsOf(const ImageFile& f, const std::vector<uint8_t>& disk) {
  const SafetensorsFile& st = *f.safetensors;
  ASSERT_EQ(f.tensor_digests.size(), st.tensors().size());
  for (size_t i = 0; i < st.tensors().size(); ++i) {
    const TensorInfo& t = st.tensors()[i];
    EXPECT_EQ(f.tensor_digests[i], Sha256Of(std::span<const uint8_t>(disk).subspan(
                                       st.data_start() + t.begin, t.end - t.begin)))
        << t.name;
  }
}

const ImageFile& ShardOf(const TreeImage& image) {
  return *std::find_if(image.files.begin(), image.files.end(),
                       [](const ImageFile& f) { return f.path == kShard; });
}

// A step is read in 1 MiB pieces whose hashes run on the worker's hashing thread while the next
// piece is read (docs/audit-engine.md, "Keeping storage busy"). A file cut short after the
// first piece of a step, while that piece's hash may still run: the next read comes back short
// and the stream ends with DATA_LOSS naming the file and the offset where it now ends.
TEST(StreamFaults, AFileCutShortInTheMiddleOfAStepIsDataLossNamingFileAndOffset) {
  TempDir tmp;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", tmp);
  const fs::path shard = root / kShard;
  ASSERT_GT(fs::file_size(shard), 2u << 20);  // the stream reads it in one step of 3 pieces
  std::atomic<uint64_t> cut_at = 0;
  ReadHook hook{kShard, [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    if (cut_at != 0 || length != (1u << 20)) return;  // the first piece of the step
    cut_at = offset + length + 4096;
    ASSERT_EQ(::truncate(shard.c_str(), static_cast<off_t>(cut_at.load())), 0);
  };
  const ReadOptions read = OneStepRead();
  std::shared_ptr<const TreeImage> image = DeferredImage(root, std::move(hook), read);
  ASSERT_NE(image, nullptr);
  absl::StatusOr<StreamResult> streamed = StreamTrees({image}, {}, read, NoProgress());
  ASSERT_NE(cut_at, 0u) << "no 1 MiB piece was read";
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {kShard}));
  EXPECT_THAT(std::string(streamed.status().message()),
              HasSubstr(absl::StrCat("file ends at offset ", cut_at.load())));
}

// Steps of 3 pieces hashed on the workers' hashing threads (docs/audit-engine.md, "Keeping
// storage busy") give the digests of the bytes on disk, each computed here in one call: the
// file's SHA-256, its git blob id, its range digests (a range size that is no divisor of the
// piece), every tensor's SHA-256, and a sink over all of the tensor data gets those bytes; a
// work item on each tensor gets its bytes. The same when the digests are taken behind the
// reads ("Hashing behind the reads"), by the second cursor, which also feeds the sink.
TEST(StreamFaults, DigestsAndSinksOfStepsHashedInPiecesAreThoseOfTheFile) {
  TempDir tmp;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", tmp);
  const std::vector<uint8_t> disk = ::ckpt::testing::ReadAll(root / kShard);
  ASSERT_GT(disk.size(), 2u << 20);
  uint64_t bytes_read = 0;  // without hashing behind
  for (const bool behind : {false, true}) {
    ReadOptions read = OneStepRead();
    read.tensor_digests = true;
    read.range_size = 300007;
    read.file_digests = true;
    read.hash_behind = behind;
    std::shared_ptr<const TreeImage> image =
        DeferredImage(root, ReadHook{kShard, [](int) {}}, read);
    ASSERT_NE(image, nullptr);
    const SafetensorsFile& st = *ShardOf(*image).safetensors;
    std::vector<uint8_t> sunk;
    std::vector<StreamSink> sinks;
    sinks.push_back({&st, st.data_start(), disk.size(),
                     [&sunk](uint64_t offset, std::span<const uint8_t> bytes) {
                       EXPECT_EQ(offset, sunk.size());
                       sunk.insert(sunk.end(), bytes.begin(), bytes.end());
                       return absl::OkStatus();
                     }});
    std::atomic<size_t> ran = 0;
    std::vector<StreamWork> work;
    for (const TensorInfo& t : st.tensors()) {
      StreamWork w{t.name, {{&st, &t}}, [&st, &t, &disk, &ran]() -> absl::Status {
                     const std::span<const uint8_t> lent = st.Bytes(t);
                     if (!std::equal(lent.begin(), lent.end(),
                                     disk.begin() + st.data_start() + t.begin,
                                     disk.begin() + st.data_start() + t.end)) {
                       return absl::InternalError(absl::StrCat(t.name, ": not the bytes on disk"));
                     }
                     ++ran;
                     return absl::OkStatus();
                   }};
      work.push_back(std::move(w));
    }
    absl::StatusOr<StreamResult> streamed =
        StreamTrees({image}, std::move(work), read, NoProgress(), std::move(sinks));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(ran.load(), st.tensors().size()) << behind;
    if (!behind) bytes_read = streamed->bytes_read;
    EXPECT_EQ(streamed->bytes_read, bytes_read);  // each byte once
    const ImageFile& f = ShardOf(*streamed->images[0]);
    EXPECT_EQ(f.sha256, Sha256Of(disk)) << behind;
    EXPECT_EQ(f.git_blob_id, GitBlobIdOf(disk)) << behind;
    std::vector<Digest> ranges;
    for (uint64_t at = 0; at < disk.size(); at += read.range_size) {
      ranges.push_back(Sha256Of(std::span<const uint8_t>(disk).subspan(
          at, std::min<uint64_t>(read.range_size, disk.size() - at))));
    }
    EXPECT_EQ(f.range_digests, ranges) << behind;
    ExpectTensorDigestsOf(f, disk);
    EXPECT_TRUE(sunk == std::vector<uint8_t>(disk.begin() + st.data_start(), disk.end()))
        << behind;
  }
}

// A sink that fails is not handed the pieces after its failure: the stream stops with its
// error, though the pieces of the step are hashed on another thread while the next are read.
// The same when the sinks are fed by the hashing cursor behind the reads.
TEST(StreamFaults, ASinkThatFailsGetsNoMoreBytesAndItsErrorEndsTheStream) {
  TempDir tmp;
  const fs::path root = CopyFixture("mini-kimi-mxfp4", tmp);
  ASSERT_GT(fs::file_size(root / kShard), 2u << 20);  // one step of 3 pieces
  for (const bool behind : {false, true}) {
    ReadOptions read = OneStepRead();
    read.hash_behind = behind;
    std::shared_ptr<const TreeImage> image =
        DeferredImage(root, ReadHook{kShard, [](int) {}}, read);
    ASSERT_NE(image, nullptr);
    const SafetensorsFile& st = *ShardOf(*image).safetensors;
    std::atomic<int> calls = 0;
    std::vector<StreamSink> sinks;
    sinks.push_back({&st, st.data_start(), fs::file_size(root / kShard),
                     [&calls](uint64_t, std::span<const uint8_t>) {
                       ++calls;
                       return absl::ResourceExhaustedError("the copy's disk is full");
                     }});
    absl::StatusOr<StreamResult> streamed =
        StreamTrees({image}, {}, read, NoProgress(), std::move(sinks));
    ASSERT_FALSE(streamed.ok()) << behind;
    EXPECT_EQ(streamed.status().code(), absl::StatusCode::kResourceExhausted) << streamed.status();
    EXPECT_THAT(std::string(streamed.status().message()), HasSubstr("disk is full"));
    EXPECT_EQ(calls.load(), 1) << behind;
  }
}

// Tensors of no bytes (docs/audit-engine.md, "Hashing behind the reads"): one in a file whose
// data region is empty (every tensor there has no bytes: the stream starts at the file's end),
// one at the end of a file after a tensor of bytes. Work on each runs, with or without hashing
// behind the reads, and the files get their digests.
TEST(StreamFaults, WorkOnTensorsOfNoBytesRunsAlsoWhereTheFileHasNoTensorData) {
  TempDir tmp;
  const fs::path root = tmp.path() / "tree";
  fs::create_directories(root);
  std::vector<quant::TensorToWrite> empty;
  empty.push_back(quant::TensorToWrite::Owned("e", DType::kU8, {0}, {}));
  ASSERT_TRUE(quant::WriteSafetensors((root / "empty.safetensors").string(), std::move(empty), {})
                  .ok());
  std::vector<quant::TensorToWrite> tail;
  tail.push_back(quant::TensorToWrite::Owned("a", DType::kU8, {4096},
                                             std::vector<uint8_t>(4096, 0x5a)));
  tail.push_back(quant::TensorToWrite::Owned("z", DType::kU8, {0}, {}));
  ASSERT_TRUE(
      quant::WriteSafetensors((root / "tail.safetensors").string(), std::move(tail), {}).ok());
  for (const bool behind : {false, true}) {
    ReadOptions read = OneStepRead();
    read.file_digests = true;
    read.hash_behind = behind;
    std::shared_ptr<const TreeImage> image = DeferredImage(root, ReadHook{"", [](int) {}}, read);
    ASSERT_NE(image, nullptr);
    ASSERT_EQ(image->files.size(), 2u);
    std::atomic<int> ran = 0;
    std::vector<StreamWork> work;
    for (const ImageFile& f : image->files) {
      const SafetensorsFile& st = *f.safetensors;
      StreamWork w{f.path, {}, [&ran] {
                     ++ran;
                     return absl::OkStatus();
                   }};
      for (const TensorInfo& t : st.tensors()) w.tensors.push_back({&st, &t});
      work.push_back(std::move(w));
    }
    absl::StatusOr<StreamResult> streamed = StreamTrees({image}, std::move(work), read, NoProgress());
    ASSERT_TRUE(streamed.ok()) << behind << " " << streamed.status();
    EXPECT_EQ(ran.load(), 2) << behind;
    for (const ImageFile& f : streamed->images[0]->files) {
      EXPECT_EQ(f.sha256, Sha256Of(::ckpt::testing::ReadAll(root / f.path))) << f.path;
    }
  }
}

// Cancels once `after` bytes were reported read.
class CancelAfter final : public Progress {
 public:
  explicit CancelAfter(uint64_t after) : after_(after) {}
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t n) override { done_ += n; }
  void End() override {}
  bool Cancelled() const override { return done_.load() >= after_; }
  uint64_t done() const { return done_.load(); }

 private:
  const uint64_t after_;
  std::atomic<uint64_t> done_{0};
};

// A file whose tensors are read behind the cursor in steps of 2 pieces, into reused buffers
// (docs/audit-engine.md, "Memory", "Reading behind the cursor", "Keeping storage busy"): six
// 3 MiB partners p<i> stored before their 4 MiB anchors w<i>, each tensor of distinct random
// bytes. Together the partners take more than half of a 32 MiB window (read chunk 2 MiB), so
// the cursor hashes them as it passes and each is read again when its anchor arrives. Work
// item i needs p<i> and w<i>; item 6 + i needs the same and waits for item i, which says it is
// wanted for even i only.
class ReadBehindStream : public ::testing::Test {
 protected:
  static constexpr int kPairs = 6;
  static constexpr uint64_t kWindow = 32ull << 20;
  static constexpr char kFile[] = "model.safetensors";

  void SetUp() override {
    root_ = tmp_.path() / "tree";
    fs::create_directories(root_);
    std::vector<quant::TensorToWrite> tensors;
    for (const char* kind : {"p", "w"}) {  // the writer orders tensors by name
      const uint64_t size = kind[0] == 'p' ? 3ull << 20 : 4ull << 20;
      for (int i = 0; i < kPairs; ++i) {
        std::mt19937_64 rng(tensors.size() + 1);
        std::vector<uint8_t> bytes(size);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        tensors.push_back(quant::TensorToWrite::Owned(absl::StrCat(kind, i), DType::kU8, {size},
                                                      std::move(bytes)));
      }
    }
    ASSERT_TRUE(quant::WriteSafetensors((root_ / kFile).string(), std::move(tensors), {}).ok());
    disk_ = ::ckpt::testing::ReadAll(root_ / kFile);
  }

  ReadOptions Read() const {
    ReadOptions read = Checkpoint::ReadOnly();
    read.keep = ReadOptions::Keep::kStreamTensorData;
    read.memory_window = window_;
    read.threads = 3;
    read.file_digests = true;
    read.tensor_digests = true;
    read.hash_behind = hash_behind_;
    return read;
  }

  // The stream of the file read through `hook`, with the work above; each item checks that the
  // bytes lent to it are those on disk (a failure names the tensor).
  absl::StatusOr<StreamResult> Stream(ReadHook hook, std::atomic<int>* ran,
                                      Progress& progress = NoProgress()) {
    hook.name = kFile;
    absl::StatusOr<TreeListing> listing =
        ListTree(FaultDirectory::Open(root_.string(), std::move(hook)));
    if (!listing.ok()) return listing.status();
    const ReadOptions read = Read();
    absl::StatusOr<std::shared_ptr<const TreeImage>> image =
        ReadTree(*std::move(listing), read, NoProgress());
    if (!image.ok()) return image.status();
    const SafetensorsFile& st = *(*image)->files.back().safetensors;
    std::vector<StreamWork> work;
    for (int dependent = 0; dependent < 2; ++dependent) {
      for (int i = 0; i < kPairs; ++i) {
        StreamWork w;
        w.label = absl::StrCat("item ", dependent * kPairs + i);
        for (const std::string& name : {absl::StrCat("p", i), absl::StrCat("w", i)}) {
          w.tensors.push_back({&st, st.Find(name)});
        }
        w.run = [this, &st, tensors = w.tensors, ran]() -> absl::Status {
          for (const auto& [file, t] : tensors) {
            const std::span<const uint8_t> lent = st.Bytes(*t);
            const std::span<const uint8_t> want(disk_.data() + st.data_start() + t->begin,
                                                t->end - t->begin);
            if (lent.size() != want.size() || Sha256Of(lent) != Sha256Of(want)) {
              return absl::InternalError(absl::StrCat(t->name, ": not the bytes on disk"));
            }
          }
          ++*ran;
          return absl::OkStatus();
        };
        if (dependent) {
          w.after = {static_cast<size_t>(i)};
          w.wanted = [i] { return i % 2 == 0; };
        }
        work.push_back(std::move(w));
      }
    }
    return StreamTrees({*image}, std::move(work), read, progress);
  }

  TempDir tmp_;
  fs::path root_;
  std::vector<uint8_t> disk_;
  bool hash_behind_ = false;  // ReadOptions::hash_behind
  uint64_t window_ = kWindow;
};

TEST_F(ReadBehindStream, TensorsReadAgainIntoReusedBuffersHoldTheBytesOnDiskAndTheirDigests) {
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(ran.load(), kPairs + kPairs / 2);
  EXPECT_EQ(streamed->bytes_read, kPairs * (7ull << 20) + kPairs * (3ull << 20));  // p<i> twice
  EXPECT_LE(streamed->peak_kept_bytes, kWindow);
  const ImageFile& f = streamed->images[0]->files.back();
  EXPECT_EQ(f.sha256, Sha256Of(disk_));
  ExpectTensorDigestsOf(f, disk_);
}

// Hashing behind the reads (docs/audit-engine.md): the same work runs on the same bytes, each
// byte is counted once but the partners twice (read again, as without), the window holds, and
// the digests are those of the file, taken by the hashing cursor.
TEST_F(ReadBehindStream, BehindTheReadsTheWorkGetsTheSameBytesAndTheFileTheSameDigests) {
  hash_behind_ = true;
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(ran.load(), kPairs + kPairs / 2);
  EXPECT_EQ(streamed->bytes_read, kPairs * (7ull << 20) + kPairs * (3ull << 20));
  EXPECT_LE(streamed->peak_kept_bytes, kWindow);
  const ImageFile& f = streamed->images[0]->files.back();
  EXPECT_EQ(f.sha256, Sha256Of(disk_));
  ExpectTensorDigestsOf(f, disk_);
}

// Behind the reads, an anchor rewritten (one byte) right after the reading cursor read it, so
// before the hashing cursor, which never runs ahead of it, reads it: the file's hash would
// cover bytes no work read. DATA_LOSS naming the tensor; no work sees the new byte.
TEST_F(ReadBehindStream, BehindTheReadsATensorChangedAfterItsReadIsDataLoss) {
  hash_behind_ = true;
  const uint64_t data = disk_.size() - kPairs * (7ull << 20);
  const uint64_t flip_at = data + kPairs * (3ull << 20) + 3 * (4ull << 20) - 5;  // w2's end
  std::atomic<bool> flipped = false;
  ReadHook hook{"", [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    // The first read of that byte is the reading cursor's; the hashing cursor reads it later.
    if (offset > flip_at || offset + length <= flip_at || flipped.exchange(true)) return;
    const uint8_t b = disk_[flip_at] ^ 0x01;
    OverwriteByte(root_ / kFile, flip_at, b);
  };
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
  EXPECT_TRUE(flipped.load());
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {"tensor 'w2'", "the file's hash"}));
}

// Behind the reads, the end-of-file checks are the hashing cursor's: a file that grows once
// the reading cursor is among the anchors is DATA_LOSS; cancelled there, the stream stops.
TEST_F(ReadBehindStream, BehindTheReadsAGrowingFileIsDataLossAndACancelStops) {
  hash_behind_ = true;
  std::atomic<bool> grown = false;
  ReadHook hook{"", [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t) {
    if (offset < disk_.size() - (8ull << 20) || grown.exchange(true)) return;
    std::ofstream((root_ / kFile).string(), std::ios::binary | std::ios::app) << "more bytes";
  };
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
  EXPECT_TRUE(grown.load());
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {kFile}));

  ::ckpt::testing::WriteAll(root_ / kFile, disk_);  // the file as it was
  CancelAfter progress(30ull << 20);
  ran = 0;
  streamed = Stream(ReadHook{"", [](int) {}}, &ran, progress);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kCancelled) << streamed.status();
  EXPECT_LT(progress.done(), disk_.size());
}

// A partner rewritten (one byte, in its second piece) once the cursor has hashed past it and
// before it is read again: DATA_LOSS naming it, and no work sees the new byte.
TEST_F(ReadBehindStream, APartnerChangedBeforeItsSecondReadIsDataLoss) {
  const uint64_t data = disk_.size() - kPairs * (7ull << 20);
  const uint64_t flip_at = data + 3 * (3ull << 20) + (1ull << 20) + 5;  // in p3
  std::atomic<bool> flipped = false;
  ReadHook hook{"", [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t) {
    if (offset < data + kPairs * (3ull << 20) || flipped.exchange(true)) return;
    const uint8_t b = disk_[flip_at] ^ 0x40;  // the cursor is among the anchors
    OverwriteByte(root_ / kFile, flip_at, b);
  };
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
  EXPECT_TRUE(flipped.load());
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {"tensor 'p3'", "second read"}));
}

// An I/O error on a second read behind the cursor, and one on the cursor's second piece of a
// step (its first piece's hash still running): the stream ends with that error, naming where.
TEST_F(ReadBehindStream, AReadErrorBehindOrAtTheCursorEndsTheStreamWithThatError) {
  const uint64_t data = disk_.size() - kPairs * (7ull << 20);
  for (const bool behind : {true, false}) {
    std::atomic<uint64_t> furthest = 0;
    std::atomic<bool> failed = false;
    ReadHook hook{"", [](int) {}};
    hook.after_read_at = [&](uint64_t offset, size_t length) {
      uint64_t seen = furthest.load();
      while (offset + length > seen && !furthest.compare_exchange_weak(seen, offset + length)) {
      }
    };
    hook.fail_read = [&](uint64_t offset, size_t length) {
      const bool hit = behind ? offset + length <= furthest.load() && offset >= data
                              : offset == data + kPairs * (3ull << 20) + (1ull << 20);
      if (!hit || failed.exchange(true)) return absl::OkStatus();
      return absl::DataLossError(absl::StrCat("model.safetensors: Input/output error at ", offset));
    };
    std::atomic<int> ran = 0;
    absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
    EXPECT_TRUE(failed.load()) << behind;
    ASSERT_TRUE(IsDataLossNaming(streamed.status(), {"Input/output error"})) << behind;
  }
}

// Behind the reads, the partners are read once for the work (again, at their anchors) and once
// by the hashing cursor, in either order. p3 rewritten (one byte) between the two, whichever
// comes first (the other held back by the hooks until then), on a file system that reports the
// file's times unchanged: DATA_LOSS naming p3, and no work sees the new byte (the item on it
// checks the bytes on disk before the change).
TEST_F(ReadBehindStream, BehindTheReadsAPartnerChangedBetweenItsTwoReadsIsDataLoss) {
  hash_behind_ = true;
  const uint64_t data = disk_.size() - kPairs * (7ull << 20);
  const uint64_t p3 = data + 3 * (3ull << 20);
  // The read for the work fills the buffer in steps of the 2 MiB chunk, the hashing cursor
  // reads 1 MiB pieces: [p3, p3 + 2 MiB) is the work's read, [p3 + 1 MiB, p3 + 2 MiB) the hash's.
  const uint64_t work_read = p3, hash_read = p3 + (1ull << 20);
  const uint64_t flip_at = hash_read + 5;
  for (const bool hash_first : {true, false}) {
    ::ckpt::testing::WriteAll(root_ / kFile, disk_);  // the file as it was
    std::mutex mu;
    std::condition_variable cv;
    bool flipped = false, waited_too_long = false;
    auto flip = [&] {
      std::lock_guard<std::mutex> lock(mu);
      if (flipped) return;
      const uint8_t b = disk_[flip_at] ^ 0x10;
      OverwriteByte(root_ / kFile, flip_at, b);
      flipped = true;
      cv.notify_all();
    };
    const uint64_t first = hash_first ? hash_read : work_read;
    const uint64_t second = hash_first ? work_read : hash_read;
    const size_t first_length = hash_first ? (1u << 20) : (2u << 20);
    const size_t second_length = hash_first ? (2u << 20) : (1u << 20);
    ReadHook hook{"", [](int) {}};
    hook.after_read_at = [&](uint64_t offset, size_t length) {
      if (offset == first && length == first_length) flip();
    };
    // A file system whose times do not move (a rewrite that keeps them, or a remote file
    // system): only the bytes tell.
    std::optional<io::FileIdentity> before;
    hook.identity = [&](const io::FileIdentity& real) {
      std::lock_guard<std::mutex> lock(mu);
      if (!before) before = real;
      return *before;
    };
    hook.fail_read = [&](uint64_t offset, size_t length) {
      if (offset != second || length != second_length) return absl::OkStatus();
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return flipped; })) {
        waited_too_long = true;
      }
      return absl::OkStatus();
    };
    std::atomic<int> ran = 0;
    absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
    EXPECT_TRUE(flipped) << hash_first;
    EXPECT_FALSE(waited_too_long) << hash_first;
    ASSERT_TRUE(IsDataLossNaming(streamed.status(), {"tensor 'p3'", "the file's hash"}))
        << hash_first;
  }
}

// Behind the reads, an I/O error on a read of the hashing cursor only (a range of an anchor the
// reading cursor has read): the stream ends with that error.
TEST_F(ReadBehindStream, BehindTheReadsAReadErrorOfTheHashingCursorEndsTheStream) {
  hash_behind_ = true;
  const uint64_t anchors = disk_.size() - kPairs * (4ull << 20);
  std::atomic<uint64_t> furthest = 0;
  std::atomic<bool> failed = false;
  ReadHook hook{"", [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t length) {
    uint64_t seen = furthest.load();
    while (offset + length > seen && !furthest.compare_exchange_weak(seen, offset + length)) {
    }
  };
  hook.fail_read = [&](uint64_t offset, size_t length) {
    // The reading cursor reads each anchor byte once, front to back: a read of anchor bytes
    // already read is the hashing cursor's.
    if (offset < anchors || offset + length > furthest.load() || failed.exchange(true)) {
      return absl::OkStatus();
    }
    return absl::DataLossError(absl::StrCat("model.safetensors: Input/output error at ", offset));
  };
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
  EXPECT_TRUE(failed.load());
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {"Input/output error"}));
}

// Behind the reads, once the reading cursor has read the file's last byte and before the
// hashing cursor gets there: the file cut short (the hashing cursor's read comes back short),
// or its identity moved (a file system that reports a new mtime): DATA_LOSS naming the file.
TEST_F(ReadBehindStream, BehindTheReadsAFileCutOrChangedBeforeTheHashingCursorEndsIsDataLoss) {
  hash_behind_ = true;
  for (const bool cut : {true, false}) {
    ::ckpt::testing::WriteAll(root_ / kFile, disk_);  // the file as it was
    std::atomic<bool> at_end = false;
    ReadHook hook{"", [](int) {}};
    hook.after_read_at = [&](uint64_t offset, size_t length) {
      // The first read that reaches the end is the reading cursor's.
      if (offset + length != disk_.size() || at_end.exchange(true) || !cut) return;
      ASSERT_EQ(::truncate((root_ / kFile).c_str(), static_cast<off_t>(disk_.size() - 4096)), 0);
    };
    hook.identity = [&](const io::FileIdentity& real) {
      io::FileIdentity id = real;
      if (!cut && at_end.load()) id.mtime_ns += 1;
      return id;
    };
    std::atomic<int> ran = 0;
    absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
    EXPECT_TRUE(at_end.load()) << cut;
    ASSERT_TRUE(IsDataLossNaming(streamed.status(),
                                 {kFile, cut ? "file ends at offset" : "changed while being read"}))
        << cut;
  }
}

// Whether a stream fits its window depends only on the headers and the window
// (docs/audit-engine.md, "Memory"), not on hashing behind the reads, which holds no memory of
// it: a window too small for one item, windows just above it (the cursor waits for memory) and
// one where the partners are held give the same outcome both ways, the window holds, and those
// that fit read the same bytes.
TEST_F(ReadBehindStream, BehindTheReadsEachWindowFitsOrIsExhaustedAsWithout) {
  int fits = 0;
  for (const uint64_t kib : {6144, 7200, 8192, 40960}) {  // one item needs 7 MiB
    window_ = kib << 10;
    std::optional<absl::StatusOr<StreamResult>> without;
    for (const bool behind : {false, true}) {
      hash_behind_ = behind;
      std::atomic<int> ran = 0;
      absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran);
      if (!without) {
        without = std::move(streamed);
        continue;
      }
      ASSERT_EQ(streamed.status().code(), without->status().code())
          << kib << " KiB: " << streamed.status() << " / " << without->status();
      if (!streamed.ok()) continue;
      ++fits;
      EXPECT_EQ(ran.load(), kPairs + kPairs / 2) << kib;
      EXPECT_LE(streamed->peak_kept_bytes, window_) << kib;
      EXPECT_EQ(streamed->bytes_read, (*without)->bytes_read) << kib;
      EXPECT_EQ(streamed->images[0]->files.back().sha256, Sha256Of(disk_)) << kib;
    }
  }
  EXPECT_EQ(fits, 3);
}

// Counts what a stream reports.
class CountProgress final : public Progress {
 public:
  void Begin(std::string_view, uint64_t total) override { total_ = total; }
  void Advance(uint64_t n) override { done_ += n; }
  void End() override {}
  uint64_t total() const { return total_; }
  uint64_t done() const { return done_.load(); }

 private:
  uint64_t total_ = 0;
  std::atomic<uint64_t> done_{0};
};

// Hashing behind the reads over two files streamed at once, each storing six 4 MiB anchors a<i>
// before their 512 KiB partners b<i> (docs/audit-engine.md, "Reading ahead of the cursor"):
// work item i of a file needs its a<i> and b<i>, so each b<i> is read ahead when the reading
// cursor reaches a<i>; one more item needs a0 of both files. The work gets the bytes on disk,
// the files their digests, each byte is read and reported once, the window holds. Then b3 of
// the second file is rewritten (one byte) right after its read ahead, before the hashing cursor
// reaches it, on a file system that reports its times unchanged: DATA_LOSS naming it, and no
// work sees the new byte.
TEST(StreamFaults, BehindTheReadsTwoFilesWithPartnersReadAheadAndOneChangedAfterItsReadAhead) {
  TempDir tmp;
  const fs::path root = tmp.path() / "tree";
  fs::create_directories(root);
  const std::vector<std::string> names = {"x.safetensors", "y.safetensors"};
  std::vector<std::vector<uint8_t>> disk;
  for (size_t f = 0; f < names.size(); ++f) {
    std::vector<quant::TensorToWrite> tensors;
    for (const char* kind : {"a", "b"}) {
      const uint64_t size = kind[0] == 'a' ? 4ull << 20 : 512ull << 10;
      for (int i = 0; i < 6; ++i) {
        std::mt19937_64 rng(100 * f + tensors.size() + 1);
        std::vector<uint8_t> bytes(size);
        for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
        tensors.push_back(quant::TensorToWrite::Owned(absl::StrCat(kind, i), DType::kU8, {size},
                                                      std::move(bytes)));
      }
    }
    ASSERT_TRUE(quant::WriteSafetensors((root / names[f]).string(), std::move(tensors), {}).ok());
    disk.push_back(::ckpt::testing::ReadAll(root / names[f]));
  }
  const uint64_t data_bytes = 6 * ((4ull << 20) + (512ull << 10));
  for (const bool change : {false, true}) {
    const uint64_t b3 = disk[1].size() - 3 * (512ull << 10);
    const uint64_t flip_at = b3 + 1000;
    std::atomic<bool> flipped = false;
    std::mutex mu;
    std::optional<io::FileIdentity> before;
    ReadHook hook{names[1], [](int) {}};
    const uint64_t b0 = disk[1].size() - 6 * (512ull << 10);
    std::atomic<uint64_t> anchors_read = 0;  // the end of the furthest read before b0
    std::atomic<bool> read_ahead = false;    // b3 was first read before every anchor was
    hook.after_read_at = [&](uint64_t offset, size_t length) {
      if (offset < b0) {
        uint64_t seen = anchors_read.load();
        while (offset + length > seen &&
               !anchors_read.compare_exchange_weak(seen, offset + length)) {
        }
      }
      // The first read of b3 is its read ahead: the reading cursor passes b3 only once it is
      // in, and the hashing cursor never passes the reading cursor.
      if (!change || offset > flip_at || offset + length <= flip_at || flipped.exchange(true)) {
        return;
      }
      read_ahead = anchors_read.load() < b0;
      const uint8_t b = disk[1][flip_at] ^ 0x02;
      OverwriteByte(root / names[1], flip_at, b);
    };
    hook.identity = [&](const io::FileIdentity& real) {
      std::lock_guard<std::mutex> lock(mu);
      if (!before) before = real;
      return *before;
    };
    ReadOptions read = Checkpoint::ReadOnly();
    read.keep = ReadOptions::Keep::kStreamTensorData;
    read.memory_window = 32ull << 20;
    read.threads = 3;
    read.file_digests = true;
    read.tensor_digests = true;
    read.hash_behind = true;
    absl::StatusOr<TreeListing> listing =
        ListTree(FaultDirectory::Open(root.string(), std::move(hook)));
    ASSERT_TRUE(listing.ok()) << listing.status();
    absl::StatusOr<std::shared_ptr<const TreeImage>> image =
        ReadTree(*std::move(listing), read, NoProgress());
    ASSERT_TRUE(image.ok()) << image.status();
    ASSERT_EQ((*image)->files.size(), 2u);
    std::vector<const SafetensorsFile*> st;
    for (const ImageFile& f : (*image)->files) st.push_back(f.safetensors.get());
    std::atomic<int> ran = 0;
    auto item = [&](std::string label, StreamTensors tensors) {
      StreamWork w{std::move(label), tensors, [&, tensors]() -> absl::Status {
                     for (const auto& [file, t] : tensors) {
                       const std::vector<uint8_t>& bytes = disk[file == st[0] ? 0 : 1];
                       const std::span<const uint8_t> lent = file->Bytes(*t);
                       const std::span<const uint8_t> want(
                           bytes.data() + file->data_start() + t->begin, t->end - t->begin);
                       if (lent.size() != want.size() || Sha256Of(lent) != Sha256Of(want)) {
                         return absl::InternalError(absl::StrCat(t->name, ": not the bytes on disk"));
                       }
                     }
                     ++ran;
                     return absl::OkStatus();
                   }};
      return w;
    };
    std::vector<StreamWork> work;
    for (size_t f = 0; f < 2; ++f) {
      for (int i = 0; i < 6; ++i) {
        work.push_back(item(absl::StrCat(names[f], " ", i),
                            {{st[f], st[f]->Find(absl::StrCat("a", i))},
                             {st[f], st[f]->Find(absl::StrCat("b", i))}}));
      }
    }
    work.push_back(item("both a0", {{st[0], st[0]->Find("a0")}, {st[1], st[1]->Find("a0")}}));
    CountProgress progress;
    absl::StatusOr<StreamResult> streamed = StreamTrees({*image}, std::move(work), read, progress);
    if (change) {
      EXPECT_TRUE(flipped.load());
      EXPECT_TRUE(read_ahead.load());
      ASSERT_TRUE(IsDataLossNaming(streamed.status(), {names[1], "tensor 'b3'"}));
      continue;
    }
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(ran.load(), 13);
    EXPECT_EQ(streamed->bytes_read, 2 * data_bytes);
    EXPECT_EQ(progress.total(), 2 * data_bytes);
    EXPECT_EQ(progress.done(), 2 * data_bytes);
    EXPECT_LE(streamed->peak_kept_bytes, read.memory_window);
    for (size_t f = 0; f < 2; ++f) {
      const ImageFile& out = streamed->images[0]->files[f];
      EXPECT_EQ(out.sha256, Sha256Of(disk[f])) << names[f];
      ExpectTensorDigestsOf(out, disk[f]);
    }
  }
}

// Progress counts each byte of the file's tensor data once, with and without hashing behind
// the reads (the partners' second reads are not counted again), and ends at that size.
TEST_F(ReadBehindStream, ProgressEndsAtTheTensorDataWithOrWithoutHashingBehind) {
  for (const bool behind : {false, true}) {
    hash_behind_ = behind;
    CountProgress progress;
    std::atomic<int> ran = 0;
    absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran, progress);
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    EXPECT_EQ(progress.total(), kPairs * (7ull << 20)) << behind;
    EXPECT_EQ(progress.done(), progress.total()) << behind;
  }
}

TEST_F(AuditStreamTest, CancelledAuditStopsWithoutARecord) {
  const uint64_t tree_bytes = TreeBytes(source_) + TreeBytes(derived_);
  CancelAfter progress(tree_bytes / 4);
  auto rec = Audit(kSmallWindow, progress);
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kCancelled) << rec.status();
  EXPECT_LT(progress.done(), tree_bytes);  // it stopped reading
}

// A file that grows while the cursor is among the anchors: DATA_LOSS, and no work item was lent
// bytes other than those on disk before (each checks).
TEST_F(ReadBehindStream, AFileThatGrowsWhileStreamedIsDataLoss) {
  std::atomic<bool> grown = false;
  ReadHook hook{"", [](int) {}};
  hook.after_read_at = [&](uint64_t offset, size_t) {
    if (offset < disk_.size() - (8ull << 20) || grown.exchange(true)) return;
    std::ofstream((root_ / kFile).string(), std::ios::binary | std::ios::app) << "more bytes";
  };
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
  EXPECT_TRUE(grown.load());
  ASSERT_TRUE(IsDataLossNaming(streamed.status(), {kFile}));
}

// Cancelled in the middle of the partners' second reads: CANCELLED, the stream stops reading.
TEST_F(ReadBehindStream, CancelledWhileReadingBehindTheCursorStops) {
  CancelAfter progress(30ull << 20);
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran, progress);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kCancelled) << streamed.status();
  EXPECT_LT(progress.done(), kPairs * (7ull << 20));
  EXPECT_LT(ran.load(), kPairs + kPairs / 2);
}

// Any tensor order (docs/audit-engine.md): one file, tensors in name order, of
//   a0 (4 MiB) b1 b2 b3 (5 MiB each) c4 (2 MiB) d5 d6 (5 MiB each) e7 (2 MiB) f8 (2 MiB)
// and the units {a0, f8} (f8 read ahead when the cursor reaches a0), {b1}, {b2}, {b3}, {c4},
// {d5}, {d6}, {c4, e7}, in a window of 6.5 MiB beside the header. Holding f8 from its read
// ahead until the cursor passes it, or c4 from its first unit to its last, does not fit
// beside the next 5 MiB unit: f8 is released once its unit ran and read again by the cursor;
// c4 is freed after {c4} and read again, behind the cursor, for {c4, e7}.
class AnyOrderStream : public ::testing::Test {
 protected:
  static constexpr char kFile[] = "model.safetensors";
  static constexpr uint64_t kMiB = 1ull << 20;

  void SetUp() override { Write("tree"); }

  void Write(const std::string& dir) {
    root_ = tmp_.path() / dir;
    fs::create_directories(root_);
    std::vector<quant::TensorToWrite> tensors;
    static constexpr std::pair<const char*, uint64_t> kMiBs[] = {{"a0", 4}, {"b1", 5}, {"b2", 5},
                                                                 {"b3", 5}, {"c4", 2}, {"d5", 5},
                                                                 {"d6", 5}, {"e7", 2}, {"f8", 2}};
    for (const auto& [name, mib] : kMiBs) {
      std::mt19937_64 rng(tensors.size() + 7);
      const uint64_t size = mib * kMiB;
      std::vector<uint8_t> bytes(size);
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      tensors.push_back(quant::TensorToWrite::Owned(name, DType::kU8, {size}, std::move(bytes)));
    }
    ASSERT_TRUE(quant::WriteSafetensors((root_ / kFile).string(), std::move(tensors), {}).ok());
    disk_ = ::ckpt::testing::ReadAll(root_ / kFile);
    auto st = SafetensorsFile::Open((root_ / kFile).string());
    ASSERT_TRUE(st.ok()) << st.status();
    for (const TensorInfo& t : (*st)->tensors()) offset_[t.name] = (*st)->data_start() + t.begin;
  }

  // The stream through `hook`; each unit checks that the bytes lent to it are those on disk
  // before any change (a failure names the tensor).
  absl::StatusOr<StreamResult> Stream(ReadHook hook, std::atomic<int>* ran) {
    hook.name = kFile;
    absl::StatusOr<TreeListing> listing =
        ListTree(FaultDirectory::Open(root_.string(), std::move(hook)));
    if (!listing.ok()) return listing.status();
    ReadOptions read = Checkpoint::ReadOnly();
    read.keep = ReadOptions::Keep::kStreamTensorData;
    read.threads = 3;
    read.file_digests = true;
    read.tensor_digests = true;
    absl::StatusOr<std::shared_ptr<const TreeImage>> image =
        ReadTree(*std::move(listing), read, NoProgress());
    if (!image.ok()) return image.status();
    read.memory_window = window_ = (*image)->kept_bytes + 6 * kMiB + kMiB / 2;
    const SafetensorsFile& st = *(*image)->files.back().safetensors;
    std::vector<StreamWork> work;
    for (const std::vector<std::string>& names : std::vector<std::vector<std::string>>{
             {"a0", "f8"}, {"b1"}, {"b2"}, {"b3"}, {"c4"}, {"d5"}, {"d6"}, {"c4", "e7"}}) {
      StreamWork w;
      w.label = absl::StrJoin(names, "+");
      for (const std::string& name : names) w.tensors.push_back({&st, st.Find(name)});
      w.run = [this, &st, tensors = w.tensors, ran]() -> absl::Status {
        for (const auto& [file, t] : tensors) {
          const std::span<const uint8_t> want(disk_.data() + st.data_start() + t->begin,
                                              t->end - t->begin);
          if (Sha256Of(st.Bytes(*t)) != Sha256Of(want)) {
            return absl::InternalError(absl::StrCat(t->name, ": not the bytes on disk"));
          }
        }
        ++*ran;
        return absl::OkStatus();
      };
      work.push_back(std::move(w));
    }
    return StreamTrees({*image}, std::move(work), read, NoProgress());
  }

  TempDir tmp_;
  fs::path root_;
  std::vector<uint8_t> disk_;
  std::map<std::string, uint64_t> offset_;  // where each tensor starts in the file
  uint64_t window_ = 0;
};

TEST_F(AnyOrderStream, WhatTheWindowCannotHoldIsReadAgainCheckedAndCounted) {
  std::atomic<int> ran = 0;
  absl::StatusOr<StreamResult> streamed = Stream(ReadHook{"", [](int) {}}, &ran);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(ran.load(), 8);
  EXPECT_LE(streamed->peak_kept_bytes, window_);
  EXPECT_EQ(streamed->reread_tensors, 2u);  // f8 by the cursor, c4 behind it
  EXPECT_EQ(streamed->reread_bytes, 4 * kMiB);
  EXPECT_EQ(streamed->bytes_read, 35 * kMiB + 4 * kMiB);
  const std::optional<Digest>& file_digest = streamed->images[0]->files.back().sha256;
  ASSERT_TRUE(file_digest.has_value());
  EXPECT_EQ(ToHex(*file_digest), ToHex(Sha256Of(disk_)));
}

// f8 rewritten (one byte) after its read ahead, before the cursor hashes it; c4 rewritten
// after its first unit, before it is read again; on a file system that reports the file's
// times unchanged: DATA_LOSS naming each, and no unit sees the new byte.
TEST_F(AnyOrderStream, ATensorChangedBetweenItsTwoReadsIsDataLoss) {
  for (const auto& [tensor, from, words] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"f8", "b1", "read ahead for the checks"}, {"c4", "d5", "second read"}}) {
    Write(tensor);
    // Once the cursor reads `from`: f8 was read ahead and its unit ran ({b1} waits for the
    // memory), c4 was read and its first unit runs on the bytes in memory.
    const uint64_t flip_at = offset_.at(tensor) + kMiB / 2 + 3;
    std::mutex mu;
    std::atomic<bool> flipped = false;
    std::optional<io::FileIdentity> before;
    ReadHook hook{"", [](int) {}};
    hook.after_read_at = [&](uint64_t offset, size_t) {
      if (offset < offset_.at(from) || offset >= offset_.at(from) + kMiB ||
          flipped.exchange(true)) {
        return;
      }
      OverwriteByte(root_ / kFile, flip_at, disk_[flip_at] ^ 0x20);
    };
    hook.identity = [&](const io::FileIdentity& real) {
      std::lock_guard<std::mutex> lock(mu);
      if (!before) before = real;
      return *before;
    };
    std::atomic<int> ran = 0;
    absl::StatusOr<StreamResult> streamed = Stream(std::move(hook), &ran);
    EXPECT_TRUE(flipped.load()) << tensor;
    EXPECT_TRUE(IsDataLossNaming(streamed.status(), {"tensor '" + tensor + "'", words})) << tensor;
  }
}

}  // namespace
}  // namespace ckpt::audit
