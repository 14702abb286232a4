#include "core/evidence/provenance.h"


#include "absl/strings/str_cat.h"
#include "core/evidence/json_guard.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/strict_json.h"
#include "core/text/json_dump.h"

namespace ckpt::evidence {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

absl::StatusOr<ojson> Descriptors(const std::vector<Subject>& subjects, const char* what) {
  ojson out = ojson::array();
  for (const Subject& s : subjects) {
    if (!IsSha256Hex(s.sha256)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", s.name, ": sha256 is not 64 lowercase hex characters"));
    }
    out.push_back({{"name", s.name}, {"digest", {{"sha256", s.sha256}}}});
  }
  return out;
}

// A name + sha256 descriptor, or INVALID_ARGUMENT.
absl::StatusOr<Subject> ReadDescriptor(const json& d, const std::string& where) {
  if (!d.is_object() || !d.contains("name") || !d["name"].is_string() || !d.contains("digest") ||
      !d["digest"].is_object() || !d["digest"].contains("sha256") ||
      !d["digest"]["sha256"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": needs a name and a sha256 digest"));
  }
  Subject s{d["name"].get<std::string>(), d["digest"]["sha256"].get<std::string>()};
  if (!IsSha256Hex(s.sha256)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " ", s.name, ": sha256 is not 64 lowercase hex characters"));
  }
  return s;
}

}  // namespace

absl::StatusOr<std::string> ProvenancePayload(const TranscodeProvenance& p) {
  auto subjects = Descriptors(p.derived, "subject");
  if (!subjects.ok()) return subjects.status();
  auto deps = Descriptors(p.source, "dependency");
  if (!deps.ok()) return deps.status();
  ojson external = {{"target_format", p.target_format},
                    {"policy", {{"name", p.policy.name},
                                {"version", p.policy.version},
                                {"thresholds", p.policy.thresholds}}},
                    {"source", p.source_path},
                    {"output", p.output_path}};
  if (!p.layout.empty()) external["layout"] = p.layout;
  if (!p.source_ref.empty()) {
    external["source_ref"] = p.source_ref;
    deps->push_back({{"name", kSourceRefName}, {"uri", p.source_ref}});
  }
  ojson statement = {
      {"_type", "https://in-toto.io/Statement/v1"},
      {"subject", *subjects},
      {"predicateType", kSlsaProvenanceType},
      {"predicate",
       {{"buildDefinition",
         {{"buildType", kTranscodeBuildType},
          {"externalParameters", external},
          {"resolvedDependencies", *deps}}},
        {"runDetails",
         {{"builder",
           {{"id", kCliBuilderId},
            {"version", {{p.environment.tool, p.environment.tool_version}}}}},
          {"metadata", {{"startedOn", p.started_at}, {"finishedOn", p.finished_at}}},
          {"byproducts", ojson::array({{{"name", "environment"},
                                        {"annotations", p.environment.ToJson()}}})}}}}}};
  if (auto s = RejectFloats(statement); !s.ok()) return s;
  return DumpJson(statement);
}

absl::StatusOr<TranscodeProvenance> ParseProvenance(const std::string& payload) {
  auto j = ParseStrictJson(payload, "provenance statement");
  if (!j.ok()) return j.status();
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("provenance statement: ", why));
  };
  if (!j->is_object() || j->value("_type", "") != "https://in-toto.io/Statement/v1" ||
      j->value("predicateType", "") != kSlsaProvenanceType) {
    return bad(absl::StrCat("not an in-toto Statement v1 with predicate ", kSlsaProvenanceType));
  }
  TranscodeProvenance p;
  try {
    for (const json& s : j->at("subject")) {
      auto d = ReadDescriptor(s, "subject");
      if (!d.ok()) return d.status();
      p.derived.push_back(*d);
    }
    const json& def = j->at("predicate").at("buildDefinition");
    if (def.at("buildType").get<std::string>() != kTranscodeBuildType) {
      return bad(absl::StrCat("buildType is not ", kTranscodeBuildType));
    }
    const json& ext = def.at("externalParameters");
    p.target_format = ext.at("target_format").get<std::string>();
    if (ext.contains("layout")) p.layout = ext.at("layout").get<std::string>();
    p.policy.name = ext.at("policy").at("name").get<std::string>();
    p.policy.version = ext.at("policy").at("version").get<std::string>();
    p.policy.thresholds = ext.at("policy").at("thresholds");
    p.source_path = ext.at("source").get<std::string>();
    p.output_path = ext.at("output").get<std::string>();
    for (const json& d : def.at("resolvedDependencies")) {
      if (d.is_object() && d.value("name", "") == kSourceRefName && d.contains("uri")) {
        p.source_ref = d.at("uri").get<std::string>();
        continue;
      }
      auto s = ReadDescriptor(d, "resolvedDependencies");
      if (!s.ok()) return s.status();
      p.source.push_back(*s);
    }
    const json& run = j->at("predicate").at("runDetails");
    if (run.at("builder").at("id").get<std::string>() != kCliBuilderId) {
      return bad(absl::StrCat("builder.id is not ", kCliBuilderId));
    }
    p.environment.tool_version =
        run.at("builder").at("version").at(p.environment.tool).get<std::string>();
    p.started_at = run.at("metadata").at("startedOn").get<std::string>();
    p.finished_at = run.at("metadata").at("finishedOn").get<std::string>();
  } catch (const json::exception& e) {
    return bad(e.what());
  }
  if (p.derived.empty()) return bad("no subjects");
  return p;
}

absl::Status IndexProvenance(const nlohmann::json& predicate, RecordIndex* index) {
  const json& ext = predicate.at("buildDefinition").at("externalParameters");
  index->root = ext.at("output").get<std::string>();
  index->policy = ext.at("policy").at("name").get<std::string>();
  index->verdict = "pass";
  index->time = predicate.at("runDetails").at("metadata").at("finishedOn").get<std::string>();
  return absl::OkStatus();
}

}  // namespace ckpt::evidence
