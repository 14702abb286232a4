#include "services/daemon/gate_policy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt::daemon {
namespace {

std::string RequirementName(GateRequirement r) {
  switch (r) {
    case GateRequirement::kDerivedLossless: return "derived-lossless";
    case GateRequirement::kMxfp4Original: return "mxfp4-original";
    case GateRequirement::kNone: return "none";
  }
  return "none";
}

bool Ran(const std::string& verdict) { return verdict == "pass" || verdict == "fail"; }

}  // namespace

std::string GatePolicy::Name() const { return absl::StrCat("gate-", RequirementName(requirement)); }

std::string GatePolicy::Uri() const {
  std::string uri = absl::StrCat("ckpt-audit:gate/", RequirementName(requirement),
                                 "@1?policy=", scale_policy);
  if (!source_manifest_root.empty()) absl::StrAppend(&uri, "&source=", source_manifest_root);
  return uri;
}

std::vector<std::string> GatePolicy::RequiredChecks() const {
  switch (requirement) {
    case GateRequirement::kDerivedLossless: return {"checkpoint_structure", "pair_verify"};
    case GateRequirement::kMxfp4Original: return {"checkpoint_structure", "scale_window"};
    case GateRequirement::kNone: return {};
  }
  return {};
}

GateRequirement RequirementOf(quant::QuantFormat format, uint64_t x4t_sidecars) {
  if (x4t_sidecars > 0) return GateRequirement::kDerivedLossless;
  switch (format) {
    case quant::QuantFormat::kCompressedTensorsNvfp4:
    case quant::QuantFormat::kModelOptNvfp4:
    case quant::QuantFormat::kX4TContainerB:
      return GateRequirement::kDerivedLossless;
    case quant::QuantFormat::kGptOssMxfp4:
    case quant::QuantFormat::kCompressedTensorsMxfp4:
      return GateRequirement::kMxfp4Original;
    default:
      return GateRequirement::kNone;
  }
}

FailureScope ScopeOf(const AuditFacts& record, const std::string& check) {
  if (check == "pair_verify" || check == "source_hf_layout" || check == "block_forward") {
    // About the pair; without a bound source there is no pair it could be about.
    return record.source_manifest_root.empty() ? FailureScope::kContent : FailureScope::kSource;
  }
  // Over-span depends on the policy's window; a NaN scale (or anything else) does not.
  if (check == "scale_window" && record.scale_window_result == "over-span") {
    return FailureScope::kPolicy;
  }
  return FailureScope::kContent;
}

namespace {

// A failing check of one record that revokes a pass.
struct Revocation {
  const AuditFacts* record = nullptr;
  std::string check;
  FailureScope scope = FailureScope::kContent;
};

// The newest failure in `audits[from..]` that revokes a pass under `policy` resting on `source`
// (`rests_on_source`: the pass needs a source at all). A record that says fail without naming a
// failing check counts as a failure of the content.
std::optional<Revocation> RevokedBy(const std::vector<AuditFacts>& audits, size_t from,
                                    const std::string& policy, bool rests_on_source,
                                    const std::string& source) {
  for (size_t j = audits.size(); j-- > from;) {
    const AuditFacts& r = audits[j];
    bool any_failed = false;
    for (const auto& [check, verdict] : r.checks) {
      if (verdict != "fail") continue;
      any_failed = true;
      const FailureScope scope = ScopeOf(r, check);
      if (scope == FailureScope::kContent ||
          (scope == FailureScope::kPolicy && r.policy == policy) ||
          (scope == FailureScope::kSource && rests_on_source &&
           r.source_manifest_root == source)) {
        return Revocation{&r, check, scope};
      }
    }
    if (!any_failed && r.verdict != "pass") {
      return Revocation{&r, "verdict", FailureScope::kContent};
    }
  }
  return std::nullopt;
}

std::string AboutText(const Revocation& r) {
  switch (r.scope) {
    case FailureScope::kContent: return "a failure of the content itself";
    case FailureScope::kSource:
      return absl::StrCat("a failure against source ", r.record->source_manifest_root);
    case FailureScope::kPolicy: return absl::StrCat("a failure under policy ", r.record->policy);
  }
  return "";
}

}  // namespace

GateOutcome Decide(const GatePolicy& policy, const std::vector<AuditFacts>& audits) {
  GateOutcome out;
  const std::vector<std::string> required = policy.RequiredChecks();
  if (policy.requirement == GateRequirement::kNone) {
    out.reasons.push_back(absl::StrCat(
        "no gate policy for ", policy.format,
        ": only MXFP4 originals and NVFP4/X4T derived checkpoints can pass a gate"));
    return out;
  }
  const bool rests_on_source = policy.requirement == GateRequirement::kDerivedLossless;
  const std::string checks = absl::StrJoin(required, " and ");
  size_t other_policy = 0, incomplete = 0, other_source = 0;
  const AuditFacts* newest_failing = nullptr;  // the newest in scope that failed a required check
  std::optional<std::pair<const AuditFacts*, Revocation>> revoked;  // the newest revoked pass
  for (size_t i = audits.size(); i-- > 0;) {
    const AuditFacts& r = audits[i];
    if (r.policy != policy.scale_policy) {
      ++other_policy;
      continue;
    }
    bool ran_all = true, passed_all = true;
    std::vector<std::string> failed;
    for (const std::string& c : required) {
      auto found = r.checks.find(c);
      ran_all &= found != r.checks.end() && Ran(found->second);
      if (found != r.checks.end() && found->second == "fail") failed.push_back(c);
      passed_all &= found != r.checks.end() && found->second == "pass";
    }
    if (!ran_all) {
      ++incomplete;
      continue;
    }
    if (!policy.source_manifest_root.empty() &&
        r.source_manifest_root != policy.source_manifest_root) {
      ++other_source;
      continue;
    }
    if (!passed_all) {
      if (newest_failing == nullptr) {
        newest_failing = &r;
        out.reasons.push_back(absl::StrCat("record ", r.seq, " (", r.time,
                                           "), the newest that ran ", checks,
                                           " on exactly this content, failed: ",
                                           absl::StrJoin(failed, ", ")));
      }
      continue;
    }
    const std::string source = rests_on_source ? r.source_manifest_root : "";
    std::optional<Revocation> by = RevokedBy(audits, i, policy.scale_policy, rests_on_source,
                                             source);
    if (by) {
      if (!revoked) revoked.emplace(&r, *by);
      continue;
    }
    out.pass = true;
    out.record = r;
    out.source_manifest_root = source;
    out.reasons.clear();
    out.reasons.push_back(absl::StrCat(
        "record ", r.seq, " (", r.time, ") ran ", checks, " on exactly this content and passed (",
        policy.Uri(), ")", source.empty() ? "" : absl::StrCat(" against source ", source)));
    return out;
  }
  if (revoked) {
    const auto& [pass, by] = *revoked;
    out.record = *by.record;
    out.reasons.clear();
    out.reasons.push_back(absl::StrCat(
        "record ", pass->seq, " (", pass->time, ") passed ", checks, " on exactly this content",
        rests_on_source ? absl::StrCat(" against source ", pass->source_manifest_root) : "",
        ", but record ", by.record->seq, " (", by.record->time, ") of the same content failed ",
        by.check, ": ", AboutText(by), ", which revokes it (docs/daemon.md \"Revocation\")"));
    return out;
  }
  if (newest_failing != nullptr) {
    out.record = *newest_failing;
    return out;
  }
  std::string scope = absl::StrCat(checks, " under policy ", policy.scale_policy);
  if (!policy.source_manifest_root.empty()) {
    absl::StrAppend(&scope, " against source ", policy.source_manifest_root);
  }
  std::string reason = absl::StrCat("no audit record of exactly this content (", policy.format,
                                    ") ran ", scope, "; run that audit first");
  if (!audits.empty()) {
    absl::StrAppend(&reason, " (", audits.size(), " record(s) of this content cannot decide: ",
                    incomplete, " did not run every required check, ", other_policy,
                    " under another policy, ", other_source, " against another source)");
  }
  out.reasons.push_back(std::move(reason));
  return out;
}

}  // namespace ckpt::daemon
