#include "core/oci/attach_record.h"

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/environment.h"
#include "core/evidence/oms_bundle.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/evidence/test_result.h"
#include "core/evidence/trust_store.h"
#include "core/interop/intoto_bundle.h"
#include "core/interop/publish.h"
#include "core/oci/registry.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"

namespace ckpt::oci {
namespace {

struct Statement {
  std::string predicate_type;
  std::string payload;
};

// The verification summary of record `id` (payload `record_payload`, envelope `envelope`) with
// the manifest as its only subject, built as the daemon builds a gate decision.
absl::StatusOr<Statement> SummaryFor(const storage::EvidenceLog& log, uint64_t id,
                                     const std::string& envelope,
                                     const std::string& record_payload,
                                     const evidence::RecordIndex& idx, const std::string& hex,
                                     const std::string& verifier_id) {
  auto j = evidence::ParseStrictJson(record_payload, absl::StrCat("record ", id));
  if (!j.ok()) return j.status();
  const nlohmann::json& predicate = (*j)["predicate"];
  const nlohmann::json& policy = predicate.contains("policy") ? predicate["policy"] : predicate;
  if (!policy.is_object() || !policy.contains("name") || !policy["name"].is_string() ||
      !policy.contains("version") || !policy["version"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("record ", id, ": no policy name and version"));
  }
  evidence::EvidenceRecord summary;
  summary.root = idx.root;
  summary.policy = {policy["name"].get<std::string>(), policy["version"].get<std::string>(),
                    nlohmann::ordered_json::object()};
  summary.environment = evidence::CollectEnvironment();
  summary.started_at = summary.finished_at = idx.time;
  summary.subjects = {{evidence::kOciManifestSubject, hex}};
  for (const evidence::Subject& s : idx.source_subjects) {
    if (s.name == evidence::kManifestRootSubject) {
      summary.source = evidence::SourceBinding{"", s.sha256, {}};
    }
  }
  evidence::CheckResult verdict;
  verdict.name = "record";
  verdict.verdict = idx.verdict == "pass" ? evidence::Verdict::kPass : evidence::Verdict::kFail;
  summary.checks.push_back(std::move(verdict));
  auto payload = evidence::VerificationSummaryPayload(
      summary, verifier_id, interop::EntryUri(log, id),
      ToHex(Sha256Of(evidence::AsBytes(envelope))));
  if (!payload.ok()) return payload.status();
  return Statement{evidence::kVerificationSummaryType, *std::move(payload)};
}

// The logged test result of record `id`, its subject replaced by the manifest.
absl::StatusOr<Statement> TestResultFor(const storage::EvidenceLog& log, uint64_t id,
                                        const std::string& hex) {
  auto bundle = interop::ExportInTotoBundle(log, id);
  if (!bundle.ok()) return bundle.status();
  for (uint64_t companion : bundle->ids) {
    auto e = log.Get(companion);
    if (!e.ok()) return e.status();
    if (e->predicate_type != evidence::kTestResultPredicateType) continue;
    auto env = evidence::ParseEnvelope(e->envelope);
    if (!env.ok()) return env.status();
    auto j = evidence::ParseStrictJson(env->payload, absl::StrCat("test result ", companion));
    if (!j.ok()) return j.status();
    (*j)["subject"] = nlohmann::json::array(
        {{{"name", evidence::kOciManifestSubject}, {"digest", {{"sha256", hex}}}}});
    return Statement{evidence::kTestResultPredicateType, DumpJson(*j)};
  }
  return absl::NotFoundError(absl::StrCat("record ", id, " has no test result in the log"));
}

}  // namespace

absl::StatusOr<std::vector<AttachedStatement>> AttachRecord(const storage::EvidenceLog& log,
                                                            uint64_t id,
                                                            const Reference& manifest,
                                                            const evidence::SigningKey& key,
                                                            const std::string& verifier_id) {
  if (manifest.digest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest.ToString(), ": a referrer's subject is a manifest digest"));
  }
  auto entry = log.Get(id);
  if (!entry.ok()) return entry.status();
  if (entry->predicate_type != evidence::kEvidencePredicateType) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry ", id, " is a ", entry->predicate_type, ", not an evidence record"));
  }
  auto env = evidence::ParseEnvelope(entry->envelope);
  if (!env.ok()) return env.status();
  // Attaching vouches for the record with the evidence key: the record must be signed by it.
  evidence::TrustStore own;
  own.Add(key.public_key());
  if (auto signer = evidence::VerifyEnvelope(*env, own); !signer.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "record ", id, " is not signed by the key attach signs with: ", signer.status().message()));
  }
  auto idx = evidence::IndexPayload(env->payload);
  if (!idx.ok()) return idx.status();
  // The binding is the typed field only the engine sets, from a registry read; a subject
  // named oci-manifest is not read (docs/interop.md, "How digests bind").
  const std::string hex = manifest.digest.substr(7);
  auto root = ParseReference(idx->root);
  if (idx->oci_manifest != manifest.digest || !root.ok() || root->digest != manifest.digest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "not-audited-from-manifest: record ", id, " (root ", idx->root, ") was ",
        idx->oci_manifest.empty() ? "not audited from an OCI manifest"
                                  : absl::StrCat("audited from manifest ", idx->oci_manifest),
        ", not from ", manifest.ToString()));
  }
  auto summary = SummaryFor(log, id, entry->envelope, env->payload, *idx, hex, verifier_id);
  if (!summary.ok()) return summary.status();
  auto test_result = TestResultFor(log, id, hex);
  if (!test_result.ok()) return test_result.status();

  auto reg = Registry::Connect(manifest);
  if (!reg.ok()) return reg.status();
  auto model = (*reg)->GetManifest(manifest.digest);
  if (!model.ok()) return model.status();
  Descriptor subject;
  subject.media_type = model->media_type.empty() ? kOciManifest : model->media_type;
  subject.digest = manifest.digest;
  subject.size = model->bytes.size();
  std::vector<AttachedStatement> out;
  for (const Statement& st : {*summary, *test_result}) {
    auto signed_text = evidence::SignEnvelope(st.payload, evidence::kInTotoPayloadType, key);
    if (!signed_text.ok()) return signed_text.status();
    auto signed_env = evidence::ParseEnvelope(*signed_text);
    if (!signed_env.ok()) return signed_env.status();
    // The same bundle layout as `sign` writes (core/evidence/oms_bundle.h).
    const std::string bundle = evidence::OmsKeyBundleJson(
        st.payload, signed_env->signatures[0].sig, signed_env->signatures[0].keyid);
    auto attached = AttachBundle(**reg, subject, bundle, st.predicate_type);
    if (!attached.ok()) return attached.status();
    out.push_back({st.predicate_type, *std::move(attached)});
  }
  return out;
}

}  // namespace ckpt::oci
