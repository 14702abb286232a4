// Weights no check reads (docs/audit-engine.md, "Weights no check reads"): a file that a common
// loader reads by default from the root fails the audit with a named finding; other weight-like
// files are listed in the record as unchecked without failing it; `inspect` lists both.
#include <algorithm>
#include <filesystem>
#include <string>

#include "core/audit/audit_checks.h"
#include "core/audit/weight_files.h"
#include "core/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

const evidence::CheckResult& Structure(const evidence::EvidenceRecord& rec) {
  for (const evidence::CheckResult& c : rec.checks) {
    if (c.name == "checkpoint_structure") return c;
  }
  ADD_FAILURE() << "no checkpoint_structure check";
  return rec.checks.front();
}

const evidence::Finding* FindingFor(const evidence::CheckResult& c, const std::string& path) {
  for (const evidence::Finding& f : c.findings) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

class WeightFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = CopyFixture("mini-kimi-nvfp4", tmp_); }

  evidence::EvidenceRecord Audit() {
    AuditOptions o;
    o.root = root_.string();
    absl::StatusOr<evidence::EvidenceRecord> rec = RunAudit(o, NoProgress());
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() ? *std::move(rec) : evidence::EvidenceRecord{};
  }

  // Asserts that `path` is a finding with `code` that fails (or not) the structure check.
  void ExpectFinding(const evidence::EvidenceRecord& rec, const std::string& path,
                     const std::string& code, bool fails) {
    const evidence::CheckResult& s = Structure(rec);
    const evidence::Finding* f = FindingFor(s, path);
    ASSERT_NE(f, nullptr) << path << " is not a finding of checkpoint_structure";
    EXPECT_EQ(f->code, code);
    EXPECT_EQ(f->fails, fails);
    EXPECT_EQ(f->numbers.at("bytes"), static_cast<int64_t>(fs::file_size(root_ / path)));
    EXPECT_THAT(f->message, HasSubstr(path));
    const evidence::DetailValue* listed = s.details.Find("unchecked_weight_files");
    ASSERT_NE(listed, nullptr);
    EXPECT_THAT(std::get<std::vector<std::string>>(*listed), ::testing::Contains(path));
  }

  TempDir tmp_;
  fs::path root_;
};

TEST_F(WeightFilesTest, CleanFixtureHasNoNewFinding) {
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kPass);
  const evidence::CheckResult& s = Structure(rec);
  EXPECT_TRUE(s.findings.empty());
  EXPECT_FALSE(s.counts.contains("unchecked_weight_files"));
  EXPECT_EQ(s.details.Find("unchecked_weight_files"), nullptr);
}

// The attack: a bad model.safetensors beside the index. transformers loads it in preference to
// the index, and the audit's checks read only the index's shards.
TEST_F(WeightFilesTest, UnindexedModelSafetensorsBesideTheIndexFailsTheAudit) {
  fs::copy_file(root_ / kShard1, root_ / "model.safetensors");
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kFail);
  EXPECT_EQ(Structure(rec).verdict, evidence::Verdict::kFail);
  ExpectFinding(rec, "model.safetensors", "unindexed-weights-file", true);
  const evidence::Finding* f = FindingFor(Structure(rec), "model.safetensors");
  ASSERT_NE(f, nullptr);
  EXPECT_THAT(f->message, HasSubstr("transformers loads model.safetensors"));
  // Its bytes are hashed (a subject of the record), which is not checking them.
  EXPECT_TRUE(std::any_of(rec.subjects.begin(), rec.subjects.end(),
                          [](const evidence::Subject& s) { return s.name == "model.safetensors"; }));
}

TEST_F(WeightFilesTest, ShardOnDiskThatTheIndexOmitsFailsTheAudit) {
  fs::copy_file(root_ / kShard2, root_ / "model-00003-of-00003.safetensors");
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kFail);
  ExpectFinding(rec, "model-00003-of-00003.safetensors", "unindexed-weights-file", true);
}

TEST_F(WeightFilesTest, PytorchModelBinAtTheRootFailsTheAudit) {
  WriteAll(root_ / "pytorch_model.bin", std::string(1000, 'P'));
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kFail);
  ExpectFinding(rec, "pytorch_model.bin", "unsupported-weights-file", true);
}

TEST_F(WeightFilesTest, GgufAndPtAtTheRootFailTheAudit) {
  WriteAll(root_ / "model-q4.gguf", std::string("GGUF") + std::string(60, '\0'));
  WriteAll(root_ / "consolidated.00.pth", std::string(64, 'W'));
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kFail);
  ExpectFinding(rec, "model-q4.gguf", "unsupported-weights-file", true);
  ExpectFinding(rec, "consolidated.00.pth", "unsupported-weights-file", true);
}

// gpt-oss ships its original checkpoint in original/; training state sits beside weights. No
// loader reads them by default: listed as unchecked, and the pass stands.
TEST_F(WeightFilesTest, SubfolderWeightsAndTrainingStateAreListedUncheckedWithoutFailing) {
  fs::create_directory(root_ / "original");
  fs::copy_file(root_ / kShard1, root_ / "original/model--00001-of-00002.safetensors");
  WriteAll(root_ / "training_args.bin", std::string(100, 'T'));
  WriteAll(root_ / "optimizer.pt", std::string(100, 'O'));
  evidence::EvidenceRecord rec = Audit();
  EXPECT_EQ(rec.OverallVerdict(), evidence::Verdict::kPass);
  ExpectFinding(rec, "original/model--00001-of-00002.safetensors", "unchecked-weights-file",
                false);
  ExpectFinding(rec, "training_args.bin", "unchecked-weights-file", false);
  ExpectFinding(rec, "optimizer.pt", "unchecked-weights-file", false);
  EXPECT_EQ(Structure(rec).counts.at("unchecked_weight_files"), 3);
}

TEST_F(WeightFilesTest, FailingFilesAreListedBeforeOnlyListedOnes) {
  fs::create_directory(root_ / "original");
  for (int i = 0; i < 25; ++i) {
    WriteAll(root_ / "original" / ("part-" + std::to_string(i) + ".bin"), std::string(8, 'x'));
  }
  WriteAll(root_ / "zz.bin", std::string(8, 'x'));
  evidence::EvidenceRecord rec = Audit();
  const evidence::CheckResult& s = Structure(rec);
  ASSERT_EQ(s.findings.size(), 26u);  // 25 listed, 1 failing
  EXPECT_EQ(s.findings.front().path, "zz.bin");  // kept among the record's first findings
  EXPECT_EQ(s.findings.front().fails, true);
}

// Without an index, vLLM and SGLang load every *.safetensors at the root.
TEST_F(WeightFilesTest, ExtraSafetensorsBesideASingleFileFailsTheAudit) {
  TempDir single;
  const fs::path root = single / "single";
  fs::create_directory(root);
  fs::copy_file(Fixture("mini-kimi-nvfp4/config.json"), root / "config.json");
  fs::copy_file(root_ / kShard2, root / "model.safetensors");
  fs::copy_file(root_ / kShard1, root / "adapter_model.safetensors");
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<UncheckedWeightFile> u = UncheckedWeightFiles(**ckpt);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].name, "adapter_model.safetensors");
  EXPECT_EQ(u[0].code, "unindexed-weights-file");
  EXPECT_TRUE(u[0].fails);
  EXPECT_THAT(u[0].reason, HasSubstr("vLLM"));
}

// X4T container A (docs/quant.md) puts sidecars beside an index: loaders read the index's shards.
TEST_F(WeightFilesTest, X4TSidecarBesideTheIndexIsListedNotFailing) {
  fs::copy_file(root_ / kShard2, root_ / "x4t-layer-00001.safetensors");
  auto ckpt = Checkpoint::Open(root_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<UncheckedWeightFile> u = UncheckedWeightFiles(**ckpt);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].code, "unchecked-weights-file");
  EXPECT_FALSE(u[0].fails);
}

TEST_F(WeightFilesTest, InspectListsEveryUncheckedWeightsFile) {
  fs::copy_file(root_ / kShard1, root_ / "model.safetensors");
  fs::create_directory(root_ / "original");
  WriteAll(root_ / "original" / "consolidated.pth", std::string(10, 'c'));
  TempDir scratch;
  testing::CliResult text = RunCli("inspect '" + root_.string() + "'", scratch.path());
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_THAT(text.out, ::testing::ContainsRegex(
                            "model.safetensors +[0-9.]+ [KM]iB +not checked: "
                            "unindexed-weights-file, fails an audit"));
  EXPECT_THAT(text.out, ::testing::ContainsRegex(
                            "original/consolidated.pth +10 B +not checked: "
                            "unchecked-weights-file \\("));
  testing::CliResult js = RunCli("inspect --json '" + root_.string() + "'", scratch.path());
  ASSERT_EQ(js.rc, 0) << js.err;
  nlohmann::json j = nlohmann::json::parse(js.out);
  ASSERT_EQ(j["unchecked_weight_files"].size(), 2u);
  EXPECT_EQ(j["unchecked_weight_files"][0]["path"], "model.safetensors");
  EXPECT_EQ(j["unchecked_weight_files"][0]["fails"], true);
  EXPECT_EQ(j["unchecked_weight_files"][1]["path"], "original/consolidated.pth");
  EXPECT_EQ(j["unchecked_weight_files"][1]["fails"], false);
}

}  // namespace
}  // namespace ckpt::audit
