#include "core/evidence/test_result.h"

#include "absl/strings/str_cat.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/json_guard.h"
#include "core/evidence/strict_json.h"
#include "core/text/json_dump.h"

namespace ckpt::evidence {

using ojson = nlohmann::ordered_json;

absl::StatusOr<std::string> TestResultPayload(const EvidenceRecord& record,
                                              const RecordLink& link) {
  const Subject* root = nullptr;
  for (const Subject& s : record.subjects) {
    if (s.name == kManifestRootSubject) root = &s;
  }
  if (root == nullptr || !IsSha256Hex(root->sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat("record of ", record.root, " has no valid ", kManifestRootSubject,
                     " subject; a test result needs the OMS manifest ROOT"));
  }
  if (!IsSha256Hex(link.envelope_sha256)) {
    return absl::InvalidArgumentError("record link: envelope digest is not 64 hex characters");
  }
  ojson passed = ojson::array(), failed = ojson::array();
  for (const CheckResult& c : record.checks) {
    if (c.verdict == Verdict::kPass) passed.push_back(c.name);
    if (c.verdict == Verdict::kFail) failed.push_back(c.name);
  }
  const bool pass = record.OverallVerdict() == Verdict::kPass;
  ojson policy = {
      {"name", record.policy.name},
      {"uri", absl::StrCat("ckpt-audit:policy/", record.policy.name, "@", record.policy.version)},
      {"annotations",
       {{"version", record.policy.version}, {"thresholds", record.policy.thresholds}}}};
  ojson record_ref = {{"name", kRecordLinkName},
                      {"uri", link.uri},
                      {"digest", {{"sha256", link.envelope_sha256}}},
                      {"mediaType", "application/vnd.dsse.envelope.v1+json"}};
  ojson statement = {
      {"_type", "https://in-toto.io/Statement/v1"},
      {"subject", ojson::array({{{"name", kManifestRootSubject},
                                 {"digest", {{"sha256", root->sha256}}}}})},
      {"predicateType", kTestResultPredicateType},
      {"predicate",
       {{"result", pass ? "PASSED" : "FAILED"},
        {"configuration", ojson::array({policy, record_ref})},
        {"url", link.uri},
        {"passedTests", passed},
        {"warnedTests", ojson::array()},
        {"failedTests", failed}}}};
  if (auto s = RejectFloats(statement); !s.ok()) return s;
  return DumpJson(statement);
}

absl::StatusOr<RecordLink> TestResultRecordLink(const std::string& payload) {
  absl::StatusOr<nlohmann::json> parsed = ParseStrictJson(payload, "statement");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("predicateType", "") != kTestResultPredicateType ||
      !j.contains("predicate") || !j["predicate"].is_object()) {
    return absl::InvalidArgumentError("not a test-result statement");
  }
  const auto& config = j["predicate"].value("configuration", nlohmann::json::array());
  for (const auto& c : config) {
    if (!c.is_object() || c.value("name", "") != kRecordLinkName) continue;
    if (!c.contains("digest") || !c["digest"].is_object() || !c.contains("uri") ||
        !c["uri"].is_string()) {
      break;
    }
    RecordLink link{c["uri"].get<std::string>(), c["digest"].value("sha256", "")};
    if (IsSha256Hex(link.envelope_sha256)) return link;
    break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("test result names no ", kRecordLinkName, " with a sha256 digest"));
}

absl::Status IndexTestResult(const nlohmann::json& predicate, RecordIndex* index) {
  const std::string result = predicate.at("result").get<std::string>();
  if (result != "PASSED" && result != "FAILED") {
    return absl::InvalidArgumentError(absl::StrCat("test result '", result, "'"));
  }
  index->verdict = result == "PASSED" ? "pass" : "fail";
  index->policy = predicate.at("configuration").at(0).at("name").get<std::string>();
  return absl::OkStatus();
}

}  // namespace ckpt::evidence
