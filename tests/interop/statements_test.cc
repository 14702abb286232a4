// The standard statements: the in-toto Test Result built from a record (a pure function), SLSA
// provenance written and read back, PublishAudit appending a record with its linked test result
// (both verifiable, the log still verifying), and the in-toto bundle export of a record with its
// companions.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/dsse.h"
#include "core/evidence/provenance.h"
#include "core/evidence/test_result.h"
#include "core/interop/intoto_bundle.h"
#include "core/interop/publish.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/log_verifier.h"
#include "tests/test_util.h"

namespace ckpt::interop {
namespace {

using ::ckpt::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kRoot(64, 'a');
const std::string kFile(64, 'b');

evidence::CheckResult Check(const std::string& name, evidence::Verdict verdict) {
  evidence::CheckResult c;
  c.name = name;
  c.verdict = verdict;
  return c;
}

evidence::EvidenceRecord SampleRecord(evidence::Verdict structure = evidence::Verdict::kPass) {
  evidence::EvidenceRecord r;
  r.root = "/models/m";
  r.subjects = {{"model.safetensors", kFile}, {evidence::kManifestRootSubject, kRoot}};
  r.policy = {"scale-window", "1", {{"max_span", 17}}};
  r.checks.push_back(Check("fingerprint", evidence::Verdict::kPass));
  r.checks.push_back(Check("checkpoint_structure", structure));
  r.checks.push_back(Check("scale_window", evidence::Verdict::kSkipped));
  r.started_at = "2026-01-01T00:00:00.000Z";
  r.finished_at = "2026-01-01T00:00:01.000Z";
  return r;
}

TEST(TestResult, SummarizesTheRecordForTheOmsRoot) {
  const evidence::RecordLink link{"ckpt-audit.local/x#4", std::string(64, 'c')};
  auto payload = evidence::TestResultPayload(SampleRecord(), link);
  ASSERT_TRUE(payload.ok()) << payload.status();
  json j = json::parse(*payload);
  EXPECT_EQ(j["_type"], "https://in-toto.io/Statement/v1");
  EXPECT_EQ(j["predicateType"], "https://in-toto.io/attestation/test-result/v0.1");
  ASSERT_EQ(j["subject"].size(), 1u);
  EXPECT_EQ(j["subject"][0]["digest"]["sha256"], kRoot);
  const json& p = j["predicate"];
  EXPECT_EQ(p["result"], "PASSED");
  EXPECT_EQ(p["passedTests"], json({"fingerprint", "checkpoint_structure"}));
  EXPECT_EQ(p["failedTests"], json::array());
  EXPECT_EQ(p["warnedTests"], json::array());
  EXPECT_EQ(p["url"], link.uri);
  EXPECT_EQ(p["configuration"][0]["name"], "scale-window");
  EXPECT_EQ(p["configuration"][0]["uri"], "ckpt-audit:policy/scale-window@1");
  EXPECT_EQ(p["configuration"][0]["annotations"]["thresholds"]["max_span"], 17);
  auto back = evidence::TestResultRecordLink(*payload);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->uri, link.uri);
  EXPECT_EQ(back->envelope_sha256, link.envelope_sha256);
  // Pure: the same inputs give the same bytes.
  EXPECT_EQ(*evidence::TestResultPayload(SampleRecord(), link), *payload);

  auto failed = evidence::TestResultPayload(SampleRecord(evidence::Verdict::kFail), link);
  json f = json::parse(*failed);
  EXPECT_EQ(f["predicate"]["result"], "FAILED");
  EXPECT_EQ(f["predicate"]["failedTests"], json({"checkpoint_structure"}));
  auto idx = evidence::IndexPayload(*failed);
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->verdict, "fail");
  EXPECT_EQ(idx->policy, "scale-window");
}

TEST(TestResult, NeedsTheOmsRootAndAWellFormedLink) {
  evidence::EvidenceRecord r = SampleRecord();
  r.subjects.pop_back();
  EXPECT_FALSE(evidence::TestResultPayload(r, {"u", std::string(64, 'c')}).ok());
  EXPECT_FALSE(evidence::TestResultPayload(SampleRecord(), {"u", "not-hex"}).ok());
}

evidence::TranscodeProvenance SampleProvenance() {
  evidence::TranscodeProvenance p;
  p.derived = {{"model.safetensors", kFile}, {evidence::kManifestRootSubject, kRoot}};
  p.source = {{"model.safetensors", std::string(64, 'd')},
              {evidence::kManifestRootSubject, std::string(64, 'e')}};
  p.source_ref = "hf://org/model@0123abcd";
  p.target_format = "nvfp4";
  p.policy = {"scale-window", "1", {{"max_span", 17}}};
  p.source_path = "/src";
  p.output_path = "/dst";
  p.environment = evidence::CollectEnvironment();
  p.started_at = "2026-01-01T00:00:00.000Z";
  p.finished_at = "2026-01-01T00:00:02.000Z";
  return p;
}

TEST(Provenance, SlsaV1ShapeAndRoundTrip) {
  auto payload = evidence::ProvenancePayload(SampleProvenance());
  ASSERT_TRUE(payload.ok()) << payload.status();
  json j = json::parse(*payload);
  EXPECT_EQ(j["predicateType"], "https://slsa.dev/provenance/v1");
  const json& def = j["predicate"]["buildDefinition"];
  EXPECT_EQ(def["buildType"], "https://ckpt-audit.dev/transcode/v1");
  EXPECT_EQ(def["externalParameters"]["target_format"], "nvfp4");
  EXPECT_EQ(def["externalParameters"]["policy"]["name"], "scale-window");
  EXPECT_EQ(def["resolvedDependencies"].size(), 3u);  // 1 file, the OMS ROOT, the source ref
  EXPECT_EQ(def["resolvedDependencies"][2]["uri"], "hf://org/model@0123abcd");
  const json& run = j["predicate"]["runDetails"];
  EXPECT_EQ(run["builder"]["id"], "https://ckpt-audit.dev/cli");
  EXPECT_EQ(run["metadata"]["finishedOn"], "2026-01-01T00:00:02.000Z");
  EXPECT_EQ(run["byproducts"][0]["annotations"]["tool"], "ckpt-audit");

  auto back = evidence::ParseProvenance(*payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->derived.size(), 2u);
  EXPECT_EQ(back->source.size(), 2u);
  EXPECT_EQ(back->source[1].sha256, std::string(64, 'e'));
  EXPECT_EQ(back->source_ref, "hf://org/model@0123abcd");
  EXPECT_EQ(back->policy.thresholds["max_span"], 17);
  EXPECT_EQ(back->layout, "");  // not given: not written, and none read back
  EXPECT_FALSE(def["externalParameters"].contains("layout"));
  auto idx = evidence::IndexPayload(*payload);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->root, "/dst");
  EXPECT_EQ(idx->time, "2026-01-01T00:00:02.000Z");
}

TEST(Provenance, RecordsTheTranscodeLayout) {
  evidence::TranscodeProvenance p = SampleProvenance();
  p.layout = "modelopt";
  auto payload = evidence::ProvenancePayload(p);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(json::parse(*payload)["predicate"]["buildDefinition"]["externalParameters"]["layout"],
            "modelopt");
  auto back = evidence::ParseProvenance(*payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->layout, "modelopt");
}

TEST(Provenance, ReadingRejectsWhatItDidNotWrite) {
  std::string payload = *evidence::ProvenancePayload(SampleProvenance());
  json j = json::parse(payload);
  json other = j;
  other["predicate"]["buildDefinition"]["buildType"] = "https://example.com/build";
  EXPECT_THAT(evidence::ParseProvenance(other.dump()).status().message(), HasSubstr("buildType"));
  json bad_digest = j;
  bad_digest["subject"][0]["digest"]["sha256"] = "00";
  EXPECT_FALSE(evidence::ParseProvenance(bad_digest.dump()).ok());
  std::string dup = payload;
  dup.insert(1, "\"_type\":\"x\",");
  EXPECT_THAT(evidence::ParseProvenance(dup).status().message(), HasSubstr("duplicate JSON key"));
  evidence::TranscodeProvenance p = SampleProvenance();
  p.derived[0].sha256 = "ABC";
  EXPECT_FALSE(evidence::ProvenancePayload(p).ok());
}

class PublishTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = std::make_unique<evidence::SigningKey>(*evidence::SigningKey::Generate());
    log_ = *storage::EvidenceLog::Open((dir_ / "log.db").string(), /*create=*/true);
    trust_.Add(key_->public_key());
  }
  TempDir dir_;
  std::unique_ptr<evidence::SigningKey> key_;
  std::unique_ptr<storage::EvidenceLog> log_;
  evidence::TrustStore trust_;
};

TEST_F(PublishTest, RecordAndLinkedTestResultAreLoggedAndVerify) {
  auto published = PublishAudit(SampleRecord(), *key_, *log_);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->record_id, 0u);
  EXPECT_EQ(published->test_result_id, 1u);
  EXPECT_EQ(published->last.tree_size, 2u);
  auto env = evidence::ParseEnvelope(log_->Get(1)->envelope);
  ASSERT_TRUE(env.ok());
  EXPECT_TRUE(evidence::VerifyEnvelope(*env, trust_).ok());
  auto link = evidence::TestResultRecordLink(env->payload);
  ASSERT_TRUE(link.ok());
  EXPECT_EQ(link->uri, absl::StrCat(log_->origin(), "#0"));
  EXPECT_EQ(link->envelope_sha256, ToHex(Sha256Of(evidence::AsBytes(log_->Get(0)->envelope))));
  EXPECT_EQ(log_->Get(1)->predicate_type, evidence::kTestResultPredicateType);
  auto v = storage::VerifyLog(*log_, trust_);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->ok()) << (v->problems.empty() ? "" : v->problems[0]);
}

TEST_F(PublishTest, ARecordThatCannotHaveATestResultAppendsNothing) {
  evidence::EvidenceRecord r = SampleRecord();
  r.subjects.pop_back();  // no OMS ROOT
  EXPECT_FALSE(PublishAudit(r, *key_, *log_).ok());
  EXPECT_EQ(*log_->Size(), 0u);
}

TEST_F(PublishTest, ExportHoldsTheRecordAndItsCompanionsOnly) {
  ASSERT_TRUE(PublishAudit(SampleRecord(), *key_, *log_).ok());  // 0, 1
  ASSERT_TRUE(PublishAudit(SampleRecord(), *key_, *log_).ok());  // 2, 3: same subjects
  // A verification summary of record 2, as the daemon's gate writes, is a companion too.
  std::string record2 = log_->Get(2)->envelope;
  auto vsa = evidence::VerificationSummaryPayload(
      SampleRecord(), "https://ckpt-audit.dev/ckpt-auditd", EntryUri(*log_, 2),
      ToHex(Sha256Of(evidence::AsBytes(record2))));
  ASSERT_TRUE(log_->Append(*evidence::SignEnvelope(*vsa, evidence::kInTotoPayloadType, *key_),
                           *key_)
                  .ok());  // 4

  auto bundle = ExportInTotoBundle(*log_, 2);
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  EXPECT_THAT(bundle->ids, ElementsAre(2, 3, 4));
  std::vector<std::string> lines = absl::StrSplit(bundle->jsonl, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i], log_->Get(bundle->ids[i])->envelope);
    auto env = evidence::ParseEnvelope(lines[i]);
    ASSERT_TRUE(env.ok());
    EXPECT_TRUE(evidence::VerifyEnvelope(*env, trust_).ok());
  }
  // From the test result: the same bundle.
  EXPECT_THAT(ExportInTotoBundle(*log_, 3)->ids, ElementsAre(2, 3, 4));
  EXPECT_THAT(ExportInTotoBundle(*log_, 0)->ids, ElementsAre(0, 1));
  EXPECT_EQ(ExportInTotoBundle(*log_, 9).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::interop
