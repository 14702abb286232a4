// The gate's decision over the verified records of one content (services/daemon/gate_policy.h):
// revocation follows what a failure is about (issue 21, finding 9).
#include "services/daemon/gate_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

const std::string kA(64, 'a'), kB(64, 'b');

// A verified record of the content: its policy, bound source ("" for none) and check verdicts.
AuditFacts Record(uint64_t seq, const std::string& policy, const std::string& source,
                  const std::map<std::string, std::string>& checks,
                  const std::string& scale_window_result = "") {
  AuditFacts a;
  a.seq = seq;
  a.policy = policy;
  a.source_manifest_root = source;
  a.checks = checks;
  a.scale_window_result = scale_window_result;
  a.verdict = "pass";
  for (const auto& [name, verdict] : checks) {
    if (verdict == "fail") a.verdict = "fail";
  }
  a.time = "2026-12-01T00:00:0" + std::to_string(seq) + "Z";
  return a;
}

GatePolicy Derived(const std::string& policy, const std::string& pin = "") {
  return {GateRequirement::kDerivedLossless, "compressed-tensors-nvfp4", policy, pin};
}
GatePolicy Original(const std::string& policy) {
  return {GateRequirement::kMxfp4Original, "gpt-oss-mxfp4", policy, ""};
}

const std::map<std::string, std::string> kPairPass = {{"checkpoint_structure", "pass"},
                                                      {"pair_verify", "pass"}};
const std::map<std::string, std::string> kPairFail = {{"checkpoint_structure", "pass"},
                                                      {"pair_verify", "fail"}};
const std::map<std::string, std::string> kStructureFail = {{"checkpoint_structure", "fail"},
                                                           {"pair_verify", "pass"}};

// The attack of the review: a scale-window pass and a marlin-safe pass against source A, then a
// newer failing pair audit against source B. B's failure says nothing about A.
TEST(GateDecide, AnotherSourcesPairFailureRevokesNothingRestingOnAnother) {
  std::vector<AuditFacts> audits = {Record(0, "scale-window", kA, kPairPass),
                                    Record(1, "marlin-safe", kA, kPairPass),
                                    Record(2, "scale-window", kB, kPairFail)};
  GateOutcome def = Decide(Derived("scale-window"), audits);
  EXPECT_TRUE(def.pass) << def.reasons[0];
  ASSERT_TRUE(def.record);
  EXPECT_EQ(def.record->seq, 0u);
  EXPECT_EQ(def.source_manifest_root, kA);  // an unpinned pass names its source
  EXPECT_THAT(def.reasons[0], HasSubstr("against source " + kA));
  GateOutcome marlin = Decide(Derived("marlin-safe"), audits);
  EXPECT_TRUE(marlin.pass);
  EXPECT_EQ(marlin.record->seq, 1u);
  EXPECT_TRUE(Decide(Derived("scale-window", kA), audits).pass);
  GateOutcome pinned_b = Decide(Derived("scale-window", kB), audits);
  EXPECT_FALSE(pinned_b.pass);
  EXPECT_EQ(pinned_b.record->seq, 2u);
  EXPECT_EQ(pinned_b.source_manifest_root, "");
}

// A failure of the content itself revokes its passes under every policy and pin, whatever
// source and policy the failing record names.
TEST(GateDecide, ContentFailureRevokesUnderEveryPolicyAndPin) {
  std::vector<AuditFacts> audits = {Record(0, "scale-window", kA, kPairPass),
                                    Record(1, "marlin-safe", kA, kPairPass),
                                    Record(2, "scale-window", kB, kStructureFail)};
  for (const GatePolicy& g : {Derived("scale-window"), Derived("marlin-safe"),
                              Derived("scale-window", kA), Derived("marlin-safe", kA)}) {
    GateOutcome out = Decide(g, audits);
    EXPECT_FALSE(out.pass) << g.Uri();
    ASSERT_TRUE(out.record);
    EXPECT_EQ(out.record->seq, 2u);
    EXPECT_THAT(out.reasons[0], HasSubstr("content itself"));
  }
  // A NaN scale is about the content too, from a record that ran neither pair_verify nor the
  // gate's policy.
  std::vector<AuditFacts> nan = {
      Record(0, "marlin-safe", kA, kPairPass),
      Record(1, "scale-window", "", {{"checkpoint_structure", "pass"}, {"scale_window", "fail"}},
             "rejected-nan-scale")};
  EXPECT_FALSE(Decide(Derived("marlin-safe"), nan).pass);
  // So is a failing check this daemon does not know, and a record that says fail naming none.
  std::vector<AuditFacts> unknown = {Record(0, "scale-window", kA, kPairPass),
                                     Record(1, "scale-window", "", {{"future_check", "fail"}})};
  EXPECT_FALSE(Decide(Derived("scale-window"), unknown).pass);
  std::vector<AuditFacts> bare = {Record(0, "scale-window", kA, kPairPass),
                                  Record(1, "scale-window", "", {})};
  bare[1].verdict = "fail";
  EXPECT_FALSE(Decide(Derived("scale-window"), bare).pass);
}

// A pair failure against the same source revokes; a newer pass against another source then
// decides, and names that source.
TEST(GateDecide, SameSourcePairFailureRevokesAndANewerSourceCanPass) {
  std::vector<AuditFacts> audits = {Record(0, "scale-window", kA, kPairPass),
                                    Record(1, "scale-window", kA, kPairFail)};
  GateOutcome out = Decide(Derived("scale-window"), audits);
  EXPECT_FALSE(out.pass);
  EXPECT_EQ(out.record->seq, 1u);
  EXPECT_FALSE(Decide(Derived("scale-window", kA), audits).pass);
  audits.push_back(Record(2, "scale-window", kB, kPairPass));
  out = Decide(Derived("scale-window"), audits);
  EXPECT_TRUE(out.pass);
  EXPECT_EQ(out.source_manifest_root, kB);
  EXPECT_FALSE(Decide(Derived("scale-window", kA), audits).pass);
}

// An over-span scale window depends on the policy's window: it revokes passes under that policy
// only. A pass that rests on no source (an MXFP4 original) is not revoked by a pair failure.
TEST(GateDecide, PolicyFailureRevokesOnlyThatPolicy) {
  const std::map<std::string, std::string> ok = {{"checkpoint_structure", "pass"},
                                                 {"scale_window", "pass"}};
  const std::map<std::string, std::string> over = {{"checkpoint_structure", "pass"},
                                                   {"scale_window", "fail"}};
  std::vector<AuditFacts> audits = {Record(0, "scale-window", "", ok),
                                    Record(1, "marlin-safe", "", ok),
                                    Record(2, "marlin-safe", "", over, "over-span")};
  GateOutcome marlin = Decide(Original("marlin-safe"), audits);
  EXPECT_FALSE(marlin.pass);
  EXPECT_EQ(marlin.record->seq, 2u);
  GateOutcome window = Decide(Original("scale-window"), audits);
  EXPECT_TRUE(window.pass) << window.reasons[0];
  EXPECT_EQ(window.record->seq, 0u);
  EXPECT_EQ(window.source_manifest_root, "");

  std::vector<AuditFacts> paired = {Record(
      0, "scale-window", kA,
      {{"checkpoint_structure", "pass"}, {"scale_window", "pass"}, {"pair_verify", "fail"}})};
  EXPECT_TRUE(Decide(Original("scale-window"), paired).pass);
}

// A ModelOpt NVFP4 checkpoint is a derived one (docs/formats.md §9): it passes the gate only
// with a lossless pair against its source, like compressed-tensors NVFP4 and X4T.
TEST(GateRequirement, DerivedFormatsNeedALosslessPair) {
  for (quant::QuantFormat f : {quant::QuantFormat::kCompressedTensorsNvfp4,
                               quant::QuantFormat::kModelOptNvfp4,
                               quant::QuantFormat::kX4TContainerB}) {
    EXPECT_EQ(RequirementOf(f, 0), GateRequirement::kDerivedLossless) << quant::QuantFormatName(f);
  }
  EXPECT_EQ(RequirementOf(quant::QuantFormat::kCompressedTensorsMxfp4, 0),
            GateRequirement::kMxfp4Original);
  EXPECT_EQ(RequirementOf(quant::QuantFormat::kUnknown, 0), GateRequirement::kNone);
}

}  // namespace
}  // namespace ckpt::daemon
