// The signed payload of an audit record, byte for byte: RunAudit on the fixtures (a lossless
// pair with the block forward, a pair with a flipped code and scale, an X4T pair with a root
// mapping, a single checkpoint with an over-span scale), with the times, environment and
// temporary paths fixed, must give exactly the bytes in tests/data/golden/. The record's JSON is produced
// in one place (docs/evidence.md "Where JSON is produced"); these files pin its shape. After an
// intended change of the record's schema, CKPT_UPDATE_GOLDEN=1 rewrites them (review the diff).
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_replace.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

constexpr char kPackedL1[] =
    "language_model.model.layers.1.block_sparse_moe.experts.2.w1.weight_packed";
constexpr char kScaleL1[] =
    "language_model.model.layers.1.block_sparse_moe.experts.3.w3.weight_scale";

class RecordGoldenTest : public ::testing::Test {
 protected:
  // The payload with what depends on when and where the audit ran replaced by fixed values.
  std::string Payload(evidence::EvidenceRecord rec) {
    rec.started_at = "2026-01-02T03:04:05Z";
    rec.finished_at = "2026-01-02T03:04:06Z";
    evidence::Environment env;
    env.tool_version = "golden";
    env.git_commit = "0000000";
    env.host = "host";
    env.os = "os";
    env.cpu_model = "cpu";
    rec.environment = env;
    auto payload = evidence::RecordPayload(rec);
    EXPECT_TRUE(payload.ok()) << payload.status();
    if (!payload.ok()) return "";
    return absl::StrReplaceAll(*payload, {{fs::canonical(tmp_.path()).string(), "/TMP"}});
  }

  void ExpectGolden(const std::string& name, const evidence::EvidenceRecord& rec) {
    const std::string got = Payload(rec);
    const fs::path file = Fixture("golden/" + name + ".json");
    if (std::getenv("CKPT_UPDATE_GOLDEN") != nullptr) {
      ::ckpt::testing::WriteAll(file, got + "\n");
    }
    std::vector<uint8_t> want = ::ckpt::testing::ReadAll(file);
    ASSERT_FALSE(want.empty()) << file;
    EXPECT_EQ(got + "\n", std::string(want.begin(), want.end())) << name;
  }

  absl::StatusOr<evidence::EvidenceRecord> Audit(const fs::path& root, const fs::path& source,
                                                 const std::string& layers = "") {
    AuditOptions o;
    o.root = root.string();
    o.source = source.string();
    o.forward_layers = layers;
    o.threads = 2;
    o.root_map = root_map_;
    return RunAudit(o, NoProgress());
  }

  // Flips bits of one tensor's byte at `at` in the checkpoint `root`.
  void Flip(const fs::path& root, const std::string& tensor, uint64_t at, uint8_t bits) {
    auto ckpt = Checkpoint::Open(root.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    auto t = (*ckpt)->Find(tensor);
    ASSERT_TRUE(t.has_value()) << tensor;
    const fs::path named = t->file->path();
    const fs::path file = named.is_absolute() ? named : root / named;
    const uint64_t offset = t->file->data_start() + t->info->begin + at;
    ckpt->reset();
    std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(file);
    bytes[offset] ^= bits;
    ::ckpt::testing::WriteAll(file, bytes);
  }

  TempDir tmp_;
  std::vector<quant::RootMapping> root_map_;
};

TEST_F(RecordGoldenTest, LosslessPairWithBlockForward) {
  const fs::path source = CopyFixture("mini-kimi-mxfp4", tmp_);
  const fs::path derived = CopyFixture("mini-kimi-nvfp4", tmp_);
  auto rec = Audit(derived, source, "all");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ExpectGolden("record-pair-forward", *rec);
}

TEST_F(RecordGoldenTest, PairWithFlippedCodeAndScale) {
  const fs::path source = CopyFixture("mini-kimi-mxfp4", tmp_);
  const fs::path derived = CopyFixture("mini-kimi-nvfp4", tmp_);
  Flip(derived, kPackedL1, 100, 0x11);
  Flip(derived, kScaleL1, 7, 0x08);
  auto rec = Audit(derived, source, "1");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ExpectGolden("record-pair-mismatch", *rec);
}

TEST_F(RecordGoldenTest, X4TPairWithRootMapping) {
  const fs::path source = CopyFixture("mini-kimi-mxfp4", tmp_);
  const fs::path derived = CopyFixture("mini-kimi-x4t", tmp_);
  root_map_ = {{"/x4t", fs::canonical(derived).string()}};
  auto rec = Audit(derived, source);
  ASSERT_TRUE(rec.ok()) << rec.status();
  ExpectGolden("record-x4t-pair", *rec);
}

TEST_F(RecordGoldenTest, SingleCheckpointWithAnOverSpanScale) {
  const fs::path root = CopyFixture("mini-kimi-mxfp4", tmp_);
  Flip(root, kScaleL1, 5, 0x40);  // an E8M0 exponent 64 away: over the policy's span
  auto rec = Audit(root, "");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ExpectGolden("record-single", *rec);
}

}  // namespace
}  // namespace ckpt::audit
