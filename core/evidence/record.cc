#include "core/evidence/record.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/json_guard.h"
#include "core/evidence/provenance.h"
#include "core/evidence/strict_json.h"
#include "core/evidence/test_result.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"

namespace ckpt::evidence {
namespace {

using ojson = nlohmann::ordered_json;

absl::StatusOr<ojson> SubjectsJson(const std::vector<Subject>& subjects) {
  ojson out = ojson::array();
  for (const Subject& s : subjects) {
    if (!IsSha256Hex(s.sha256)) {
      return absl::InvalidArgumentError(
          absl::StrCat("subject ", s.name, ": sha256 is not 64 lowercase hex characters"));
    }
    out.push_back({{"name", s.name}, {"digest", {{"sha256", s.sha256}}}});
  }
  return out;
}

// The block forward's JSON (its keys sorted) in the record, as it has been since schema 2.
ojson Ordered(const nlohmann::json& j) { return ojson::parse(DumpJson(j)); }

absl::StatusOr<std::string> Finish(const ojson& statement) {
  if (auto s = RejectFloats(statement); !s.ok()) return s;
  return DumpJson(statement);
}

// "sha256:" and 64 lowercase hex characters, or empty.
bool IsManifestDigestOrEmpty(const std::string& d) {
  return d.empty() || (absl::StartsWith(d, "sha256:") && IsSha256Hex(d.substr(7)));
}

}  // namespace

absl::Status CheckFileSubjectName(const std::string& root, const std::string& name) {
  if (name != kManifestRootSubject && name != kOciManifestSubject) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      EncodeName(root), "/", name, ": a file may not be named '", name,
      "', the subject name statements give a digest that names no file (docs/evidence.md, "
      "\"Reserved names\"); rename or remove it"));
}

PolicyRef ScaleWindowPolicyRef(const ScaleWindowThresholds& thresholds) {
  return {thresholds.name, std::to_string(thresholds.version), ToJson(thresholds)};
}

Verdict EvidenceRecord::OverallVerdict() const {
  for (const CheckResult& c : checks) {
    if (c.verdict == Verdict::kFail) return Verdict::kFail;
  }
  return Verdict::kPass;
}

absl::StatusOr<std::string> RecordPayload(const EvidenceRecord& r) {
  auto subjects = SubjectsJson(r.subjects);
  if (!subjects.ok()) return subjects.status();
  if (!IsManifestDigestOrEmpty(r.oci_manifest) ||
      (r.source && !IsManifestDigestOrEmpty(r.source->oci_manifest))) {
    return absl::InvalidArgumentError("an OCI manifest digest is not sha256:<64 hex>");
  }
  ojson checks = ojson::array();
  for (const CheckResult& c : r.checks) checks.push_back(c.ToJson());
  ojson predicate = {
      {"schema_version", kEvidenceSchemaVersion},
      {"root", EncodeName(r.root)},
      {"source", ojson()},
      {"policy", {{"name", r.policy.name}, {"version", r.policy.version},
                  {"thresholds", r.policy.thresholds}}},
      {"verdict", VerdictName(r.OverallVerdict())},
      {"checks", checks},
      {"pair_audit", r.pair_audit ? r.pair_audit->ToJson() : ojson()},
      {"block_forward", r.block_forward ? Ordered(r.block_forward->ToJson()) : ojson()},
      {"environment", r.environment.ToJson()},
      {"started_at", r.started_at},
      {"finished_at", r.finished_at},
  };
  if (r.source) {
    auto files = SubjectsJson(r.source->files);
    if (!files.ok()) return files.status();
    predicate["source"] = {{"root", EncodeName(r.source->root)},
                           {"manifest_root", r.source->manifest_root},
                           {"files", *files}};
    if (!r.source->oci_manifest.empty()) {
      predicate["source"]["oci_manifest"] = r.source->oci_manifest;
    }
  }
  ojson refs = ojson::object();
  for (const auto& [key, value] : {std::pair{"model_ref", &r.refs.model_ref},
                                   std::pair{"source_ref", &r.refs.source_ref},
                                   std::pair{"image_digest", &r.refs.image_digest}}) {
    if (!value->empty()) refs[key] = *value;
  }
  if (!refs.empty()) predicate["refs"] = refs;
  if (!r.invoker.empty()) predicate["invoker"] = r.invoker;
  if (!r.oci_manifest.empty()) predicate["oci_manifest"] = r.oci_manifest;
  if (!r.parts.empty()) {
    ojson parts = ojson::array();
    for (const PartRef& p : r.parts) {
      if (!IsSha256Hex(p.digest)) {
        return absl::InvalidArgumentError("a part's digest is not 64 lower-case hex characters");
      }
      parts.push_back({{"signer", p.signer}, {"host", EncodeName(p.host)}, {"sha256", p.digest}});
    }
    predicate["parts"] = parts;
  }
  ojson statement = {{"_type", "https://in-toto.io/Statement/v1"},
                     {"subject", *subjects},
                     {"predicateType", kEvidencePredicateType},
                     {"predicate", predicate}};
  return Finish(statement);
}

absl::StatusOr<std::string> VerificationSummaryPayload(const EvidenceRecord& r,
                                                       const std::string& verifier_id,
                                                       const std::string& input_uri,
                                                       const std::string& input_sha256) {
  auto subjects = SubjectsJson(r.subjects);
  if (!subjects.ok()) return subjects.status();
  bool pass = r.OverallVerdict() == Verdict::kPass;
  ojson predicate = {
      {"verifier", {{"id", verifier_id},
                    {"version", {{r.environment.tool, r.environment.tool_version}}}}},
      {"timeVerified", r.finished_at},
      {"resourceUri", absl::StrCat("file://", EncodeName(r.root))},
      {"policy", {{"uri", r.policy.uri.empty() ? absl::StrCat("ckpt-audit:policy/",
                                                               r.policy.name, "@",
                                                               r.policy.version)
                                               : r.policy.uri}}},
      {"inputAttestations",
       input_uri.empty() ? ojson::array()
                         : ojson::array({{{"uri", input_uri},
                                          {"digest", {{"sha256", input_sha256}}}}})},
      {"verificationResult", pass ? "PASSED" : "FAILED"},
      {"verifiedLevels", ojson::array({absl::StrCat("CKPT_AUDIT_", r.policy.name, "_",
                                                    pass ? "PASSED" : "FAILED")})},
  };
  if (!r.invoker.empty()) predicate["invoker"] = r.invoker;
  if (r.source) predicate["source"] = {{"manifest_root", r.source->manifest_root}};
  ojson statement = {{"_type", "https://in-toto.io/Statement/v1"},
                     {"subject", *subjects},
                     {"predicateType", kVerificationSummaryType},
                     {"predicate", predicate}};
  return Finish(statement);
}

absl::StatusOr<RecordIndex> IndexPayload(const std::string& payload) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("not an evidence statement: ", why));
  };
  absl::StatusOr<nlohmann::json> parsed = ParseStrictJson(payload, "statement");
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("_type", "") != "https://in-toto.io/Statement/v1") {
    return bad("_type is not https://in-toto.io/Statement/v1");
  }
  RecordIndex idx;
  idx.predicate_type = j.value("predicateType", "");
  if (!j.contains("subject") || !j["subject"].is_array() || !j.contains("predicate") ||
      !j["predicate"].is_object()) {
    return bad("missing subject array or predicate object");
  }
  for (const auto& s : j["subject"]) {
    if (!s.is_object() || !s.contains("digest") || !s["digest"].is_object()) {
      return bad("subject without digest");
    }
    idx.subjects.push_back({s.value("name", ""), s["digest"].value("sha256", "")});
  }
  const auto& p = j["predicate"];
  try {
    if (idx.predicate_type == kEvidencePredicateType) {
      idx.root = p.at("root").get<std::string>();
      idx.policy = p.at("policy").at("name").get<std::string>();
      idx.verdict = p.at("verdict").get<std::string>();
      idx.time = p.at("finished_at").get<std::string>();
      if (p.contains("oci_manifest")) {
        idx.oci_manifest = p.at("oci_manifest").get<std::string>();
        if (idx.oci_manifest.empty() || !IsManifestDigestOrEmpty(idx.oci_manifest)) {
          return bad("oci_manifest is not sha256:<64 hex>");
        }
      }
      if (p.contains("source") && p.at("source").is_object()) {
        const auto& src = p.at("source");
        for (const auto& f : src.at("files")) {
          idx.source_subjects.push_back(
              {f.at("name").get<std::string>(), f.at("digest").at("sha256").get<std::string>()});
        }
        idx.source_subjects.push_back(
            {kManifestRootSubject, src.at("manifest_root").get<std::string>()});
      }
    } else if (idx.predicate_type == kVerificationSummaryType) {
      std::string uri = p.at("resourceUri").get<std::string>();
      idx.root = uri.rfind("file://", 0) == 0 ? uri.substr(7) : uri;
      idx.policy = p.at("policy").at("uri").get<std::string>();
      idx.verdict = p.at("verificationResult").get<std::string>() == "PASSED" ? "pass" : "fail";
      idx.time = p.at("timeVerified").get<std::string>();
    } else if (idx.predicate_type == kTestResultPredicateType) {
      if (auto s = IndexTestResult(p, &idx); !s.ok()) return bad(std::string(s.message()));
    } else if (idx.predicate_type == kSlsaProvenanceType) {
      if (auto s = IndexProvenance(p, &idx); !s.ok()) return bad(std::string(s.message()));
    } else {
      return bad(absl::StrCat("unknown predicateType ", idx.predicate_type));
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return idx;
}

}  // namespace ckpt::evidence
