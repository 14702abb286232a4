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
    case quant::QuantFormat::kX4TContainerB:
      return GateRequirement::kDerivedLossless;
    case quant::QuantFormat::kGptOssMxfp4:
    case quant::QuantFormat::kCompressedTensorsMxfp4:
      return GateRequirement::kMxfp4Original;
    default:
      return GateRequirement::kNone;
  }
}

GateOutcome Decide(const GatePolicy& policy, const std::vector<AuditFacts>& audits) {
  GateOutcome out;
  const std::vector<std::string> required = policy.RequiredChecks();
  if (policy.requirement == GateRequirement::kNone) {
    out.reasons.push_back(absl::StrCat(
        "no gate policy for ", policy.format,
        ": only MXFP4 originals and NVFP4/X4T derived checkpoints can pass a gate"));
    return out;
  }
  size_t other_policy = 0, incomplete = 0, other_source = 0;
  for (auto it = audits.rbegin(); it != audits.rend(); ++it) {
    const AuditFacts& r = *it;
    if (r.policy != policy.scale_policy) {
      ++other_policy;
      continue;
    }
    bool ran_all = true;
    for (const std::string& c : required) {
      auto found = r.checks.find(c);
      ran_all &= found != r.checks.end() && Ran(found->second);
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
    out.record = r;
    std::vector<std::string> failed;
    for (const std::string& c : required) {
      if (r.checks.at(c) != "pass") failed.push_back(c);
    }
    out.pass = failed.empty() && r.verdict == "pass";
    if (out.pass) {
      out.reasons.push_back(absl::StrCat("record ", r.seq, " (", r.time, ") ran ",
                                         absl::StrJoin(required, " and "),
                                         " on exactly this content and passed (", policy.Uri(),
                                         ")"));
    } else {
      out.reasons.push_back(absl::StrCat(
          "record ", r.seq, " (", r.time, "), the newest that ran ",
          absl::StrJoin(required, " and "), " on exactly this content, failed",
          failed.empty() ? "" : absl::StrCat(": ", absl::StrJoin(failed, ", "))));
    }
    return out;
  }
  std::string scope = absl::StrCat(absl::StrJoin(required, " and "), " under policy ",
                                   policy.scale_policy);
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
