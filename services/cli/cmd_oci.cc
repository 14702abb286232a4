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
#include "core/evidence/record.h"
#include "core/oci/attach_record.h"
#include "core/oci/reference.h"
#include "core/oci/referrers.h"
#include "core/oci/registry.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"
#include "services/cli/settings.h"

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

int RunAttach(AttachArgs a) {
  if (absl::Status s = ApplySetting(Setting::kDb, &a.db); !s.ok()) return ReportError(s);
  if (absl::Status s = ApplySetting(Setting::kKey, &a.key.key); !s.ok()) return ReportError(s);
  auto ref = DigestReference(a.ref);
  if (!ref.ok()) return ReportError(ref.status());
  if (a.id < 0) return ReportError(absl::InvalidArgumentError("--id must be a record id >= 0"));
  const uint64_t id = static_cast<uint64_t>(a.id);
  auto setup = ResolveEvidenceSetup(a.db, a.key);
  if (!setup.ok()) return ReportError(setup.status());
  auto log = OpenLogReader(setup->db_path);
  if (!log.ok()) return ReportError(log.status());
  auto attached = oci::AttachRecord(**log, id, *ref, setup->key, kCliVerifierId);
  if (!attached.ok()) return ReportError(attached.status());
  nlohmann::ordered_json report = nlohmann::ordered_json::array();
  for (const oci::AttachedStatement& st : *attached) {
    report.push_back({{"digest", st.referrer.digest},
                      {"predicate_type", st.predicate_type},
                      {"referrers_api", st.referrer.referrers_api},
                      {"index_writes", st.referrer.index_writes}});
    if (!a.json) {
      std::printf("attached %s (%s) via %s\n", st.referrer.digest.c_str(),
                  st.predicate_type.c_str(),
                  st.referrer.referrers_api
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
  attach->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  attach->add_option("--key", a->key.key,
                     "signing key PEM or pkcs11:URI (default: $CKPT_AUDIT_KEY, then the config "
                     "file, then per-user)");
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
