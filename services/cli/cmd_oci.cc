// `ckpt-audit attach oci://REGISTRY/REPO@sha256:HEX --id N [--db PATH] [--key KEY]`: pushes the
// evidence record N's verification summary and test result, re-stated with the model manifest
// digest as their only subject and signed with the evidence key, as Sigstore bundle v0.3
// referrers of that manifest. `ckpt-audit verify-oci oci://...@sha256:HEX [--trust FILE]`
// lists and checks them (docs/interop.md, "Attaching verdicts"; core/oci/referrers.h).
// Exit 0 ok; 1 verify-oci found no passing verification summary or a referrer that failed;
// 2 error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/dsse.h"
#include "core/evidence/environment.h"
#include "core/evidence/oms_bundle.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/evidence/test_result.h"
#include "core/interop/intoto_bundle.h"
#include "core/interop/publish.h"
#include "core/oci/reference.h"
#include "core/oci/referrers.h"
#include "core/oci/registry.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"

namespace ckpt::cli {
namespace {

// The verifier id of `audit --vsa`, which the admission examples accept (docs/interop.md).
constexpr char kCliVerifierId[] = "https://ckpt-audit.dev/cli";

absl::StatusOr<oci::Reference> DigestReference(const std::string& text) {
  auto ref = oci::ParseReference(text);
  if (!ref.ok()) return ref.status();
  if (ref->digest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(text, ": name the model manifest by digest (oci://REGISTRY/REPO@sha256:HEX)"));
  }
  return ref;
}

struct AttachArgs {
  std::string ref;
  std::string db;
  int64_t id = -1;
  evidence::KeySource key;
  bool json = false;
};

struct Statement {
  std::string predicate_type;
  std::string payload;
};

// The verification summary of record `id` (payload `record_payload`, envelope `envelope`) with
// the manifest as its only subject, built as the daemon builds a gate decision.
absl::StatusOr<Statement> SummaryFor(const storage::EvidenceLog& log, uint64_t id,
                                     const std::string& envelope,
                                     const std::string& record_payload,
                                     const evidence::RecordIndex& idx, const std::string& hex) {
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
  summary.subjects = {{audit::kOciManifestSubject, hex}};
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
      summary, kCliVerifierId, interop::EntryUri(log, id),
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
        {{{"name", audit::kOciManifestSubject}, {"digest", {{"sha256", hex}}}}});
    return Statement{evidence::kTestResultPredicateType, DumpJson(*j)};
  }
  return absl::NotFoundError(absl::StrCat("record ", id, " has no test result in the log"));
}

int RunAttach(const AttachArgs& a) {
  auto ref = DigestReference(a.ref);
  if (!ref.ok()) return ReportError(ref.status());
  if (a.id < 0) return ReportError(absl::InvalidArgumentError("--id must be a record id >= 0"));
  const uint64_t id = static_cast<uint64_t>(a.id);
  auto setup = ResolveEvidenceSetup(a.db, a.key);
  if (!setup.ok()) return ReportError(setup.status());
  auto log = OpenLogReader(setup->db_path);
  if (!log.ok()) return ReportError(log.status());
  auto entry = (*log)->Get(id);
  if (!entry.ok()) return ReportError(entry.status());
  if (entry->predicate_type != evidence::kEvidencePredicateType) {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("entry ", id, " is a ", entry->predicate_type, ", not an evidence record")));
  }
  auto env = evidence::ParseEnvelope(entry->envelope);
  if (!env.ok()) return ReportError(env.status());
  // Attach vouches for the record with the evidence key: the record must be signed by it.
  evidence::TrustStore own;
  own.Add(setup->key.public_key());
  if (auto signer = evidence::VerifyEnvelope(*env, own); !signer.ok()) {
    return ReportError(absl::FailedPreconditionError(absl::StrCat(
        "record ", id, " is not signed by the key attach signs with: ", signer.status().message())));
  }
  auto idx = evidence::IndexPayload(env->payload);
  if (!idx.ok()) return ReportError(idx.status());
  const std::string hex = ref->digest.substr(7);
  std::string audited;
  for (const evidence::Subject& s : idx->subjects) {
    if (s.name == audit::kOciManifestSubject) audited = s.sha256;
  }
  if (audited != hex) {
    return ReportError(absl::FailedPreconditionError(absl::StrCat(
        "not-audited-from-manifest: record ", id, " was ",
        audited.empty() ? "not audited from an OCI manifest"
                        : absl::StrCat("audited from manifest sha256:", audited),
        ", not from ", ref->ToString())));
  }
  auto summary = SummaryFor(**log, id, entry->envelope, env->payload, *idx, hex);
  if (!summary.ok()) return ReportError(summary.status());
  auto test_result = TestResultFor(**log, id, hex);
  if (!test_result.ok()) return ReportError(test_result.status());

  auto reg = oci::Registry::Connect(*ref);
  if (!reg.ok()) return ReportError(reg.status());
  auto model = (*reg)->GetManifest(ref->digest);
  if (!model.ok()) return ReportError(model.status());
  oci::Descriptor subject;
  subject.media_type = model->media_type.empty() ? oci::kOciManifest : model->media_type;
  subject.digest = ref->digest;
  subject.size = model->bytes.size();
  nlohmann::ordered_json report = nlohmann::ordered_json::array();
  for (const Statement& st : {*summary, *test_result}) {
    auto signed_text = evidence::SignEnvelope(st.payload, evidence::kInTotoPayloadType,
                                              setup->key);
    if (!signed_text.ok()) return ReportError(signed_text.status());
    auto signed_env = evidence::ParseEnvelope(*signed_text);
    if (!signed_env.ok()) return ReportError(signed_env.status());
    // The same bundle layout as `sign` writes (core/evidence/oms_bundle.h).
    const std::string bundle = evidence::OmsKeyBundleJson(
        st.payload, signed_env->signatures[0].sig, signed_env->signatures[0].keyid);
    auto attached = oci::AttachBundle(**reg, subject, bundle, st.predicate_type);
    if (!attached.ok()) return ReportError(attached.status());
    report.push_back({{"digest", attached->digest},
                      {"predicate_type", st.predicate_type},
                      {"referrers_api", attached->referrers_api},
                      {"index_writes", attached->index_writes}});
    if (!a.json) {
      std::printf("attached %s (%s) via %s\n", attached->digest.c_str(),
                  st.predicate_type.c_str(),
                  attached->referrers_api
                      ? "the referrers API"
                      : absl::StrCat("tag ", oci::ReferrersTag(ref->digest)).c_str());
    }
  }
  if (a.json) std::printf("%s\n", DumpJson(report, 2).c_str());
  return kExitOk;
}

struct VerifyOciArgs {
  std::string ref;
  std::string trust;
  bool json = false;
};

int RunVerifyOci(const VerifyOciArgs& a) {
  auto ref = DigestReference(a.ref);
  if (!ref.ok()) return ReportError(ref.status());
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  auto reg = oci::Registry::Connect(*ref);
  if (!reg.ok()) return ReportError(reg.status());
  auto listed = oci::ListReferrers(**reg, ref->digest);
  if (!listed.ok()) return ReportError(listed.status());
  bool any_failed = false, passing_vsa = false;
  nlohmann::ordered_json out = {{"subject", ref->ToString()},
                                {"listed_by", listed->referrers_api ? "referrers-api"
                                                                    : "referrers-tag"},
                                {"referrers", nlohmann::ordered_json::array()}};
  for (const oci::Descriptor& d : listed->bundles) {
    oci::CheckedReferrer c = oci::CheckReferrer(**reg, d, ref->digest, *trust);
    const bool ok = c.reason == oci::ReferrerReason::kOk;
    any_failed |= !ok;
    passing_vsa |= ok && c.passed && c.predicate_type == evidence::kVerificationSummaryType;
    const std::string result =
        ok ? (c.passed ? "PASSED" : "FAILED") : oci::ReferrerReasonName(c.reason);
    nlohmann::ordered_json j = {{"digest", c.digest}, {"result", result}};
    if (ok) {
      j["predicate_type"] = c.predicate_type;
      j["keyid"] = c.keyid;
    } else {
      j["detail"] = c.detail;
    }
    out["referrers"].push_back(j);
    if (!a.json) {
      std::printf("%s %s %s\n", c.digest.c_str(), result.c_str(),
                  ok ? c.predicate_type.c_str() : c.detail.c_str());
    }
  }
  std::string reason;
  if (any_failed) {
    reason = "referrer-failed";
  } else if (!passing_vsa) {
    reason = "no-passing-vsa";
  }
  out["verdict"] = reason.empty() ? "pass" : "fail";
  if (!reason.empty()) out["reason"] = reason;
  if (a.json) {
    std::printf("%s\n", DumpJson(out, 2).c_str());
  } else {
    std::printf("verify-oci %s: %s%s\n", ref->ToString().c_str(),
                reason.empty() ? "pass" : "fail: ", reason.c_str());
  }
  return reason.empty() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddOciCommands(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<AttachArgs>();
  auto* attach = app.add_subcommand(
      "attach", "Push a record's verification summary and test result as OCI referrers");
  attach->add_option("REF", a->ref, "oci://REGISTRY/REPO@sha256:HEX (the audited manifest)")
      ->required();
  attach->add_option("--id", a->id, "evidence record id")->required();
  attach->add_option("--db", a->db, "evidence database (default: per-user)");
  attach->add_option("--key", a->key.key, "signing key PEM or pkcs11:URI (default: per-user)");
  AddPkcs11Flags(attach, &a->key);
  attach->add_flag("--json", a->json, "machine-readable output");
  attach->callback([=] { *exit_code = RunAttach(*a); });

  auto v = std::make_shared<VerifyOciArgs>();
  auto* verify = app.add_subcommand(
      "verify-oci", "Check the verification summaries attached to an OCI model manifest");
  verify->add_option("REF", v->ref, "oci://REGISTRY/REPO@sha256:HEX")->required();
  verify->add_option("--trust", v->trust, "trust file (default: per-user)");
  verify->add_flag("--json", v->json, "machine-readable output");
  verify->callback([=] { *exit_code = RunVerifyOci(*v); });
}

}  // namespace ckpt::cli
