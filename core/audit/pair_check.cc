#include "core/audit/pair_check.h"

#include "absl/strings/str_cat.h"
#include "core/audit/findings.h"

namespace ckpt::audit {
namespace {

// Whether `name`'s bytes are left to the stream (not in a file kept whole) and not empty.
bool Streamed(const Checkpoint& ckpt, const std::string& name) {
  const TensorRef t = *ckpt.Find(name);
  return t.info->num_bytes() > 0 && t.bytes().empty();
}

// Hashes `name`'s bytes into `hash` as the stream's cursor passes them.
StreamSink SinkInto(const Checkpoint& ckpt, const std::string& name, Sha256* hash) {
  const TensorRef t = *ckpt.Find(name);
  const uint64_t begin = t.file->data_start() + t.info->begin;
  return {t.file, begin, begin + t.info->num_bytes(),
          [hash](uint64_t, std::span<const uint8_t> bytes) {
            hash->Update(bytes);
            return absl::OkStatus();
          }};
}

}  // namespace

absl::Status PairCheck::Plan(const Checkpoints& trees, WorkPlan& plan) {
  if (trees.root == nullptr || trees.source == nullptr) return absl::OkStatus();
  trees_ = trees;
  auto planned = quant::PlanPair(*trees.source, *trees.root, options_);
  if (!planned.ok()) return planned.status();
  plan_ = *std::move(planned);
  outcomes_.resize(plan_->units.size());
  ran_.assign(plan_->units.size(), 0);
  for (size_t i = 0; i < plan_->units.size(); ++i) {
    const quant::PairUnit& u = plan_->units[i];
    if (!u.module && Streamed(*trees.source, u.name) && Streamed(*trees.root, u.name)) {
      auto& h = *hashed_.emplace_back(std::make_unique<Hashed>());
      h.unit = i;
      plan.AddSink(SinkInto(*trees.source, u.name, &h.source));
      plan.AddSink(SinkInto(*trees.root, u.name, &h.derived));
      continue;
    }
    StreamWork w{absl::StrCat("pair_verify ", u.name), {}, {}};
    WorkPlan::Need(*trees.source, u.source_tensors, &w);
    WorkPlan::Need(*trees.root, u.derived_tensors, &w);
    w.run = [this, i]() -> absl::Status {
      auto o = quant::CompareUnit(*trees_.source, *trees_.root, plan_->units[i], options_);
      if (!o.ok()) return o.status();
      outcomes_[i] = *std::move(o);
      ran_[i] = 1;
      return absl::OkStatus();
    };
    plan.Add(u.name, std::move(w));
  }
  return absl::OkStatus();
}

const std::string* PairCheck::hashed_tensor(size_t i) const {
  for (const auto& h : hashed_) {
    if (h->unit == i) return &plan_->units[i].name;
  }
  return nullptr;
}

void PairCheck::SetDigests(size_t i, const Digest& source, const Digest& derived) {
  for (const auto& h : hashed_) {
    if (h->unit != i) continue;
    outcomes_[i] = quant::CompareDigests(*trees_.source, *trees_.root, plan_->units[i], source,
                                         derived, options_);
    h->given = true;
  }
}

quant::PairVerifyResult PairCheck::Result() && {
  for (const auto& h : hashed_) {
    if (h->given) continue;
    outcomes_[h->unit] = quant::CompareDigests(*trees_.source, *trees_.root, plan_->units[h->unit],
                                               h->source.Finish(), h->derived.Finish(), options_);
  }
  return quant::FinishPair(*std::move(plan_), outcomes_);
}

evidence::CheckResult RecordOf(const quant::PairVerifyResult& r) {
  evidence::CheckResult c;
  c.name = "pair_verify";
  c.verdict = r.lossless ? evidence::Verdict::kPass : evidence::Verdict::kFail;
  c.counts["quantized_tensors"] = static_cast<int64_t>(r.quantized_tensors);
  c.counts["packed_bytes_compared"] = static_cast<int64_t>(r.packed_bytes_compared);
  c.counts["value_blocks_compared"] = static_cast<int64_t>(r.value_blocks_compared);
  c.counts["ignored_tensors_compared"] = static_cast<int64_t>(r.ignored_tensors_compared);
  c.counts["fused_groups_checked"] = static_cast<int64_t>(r.fused_groups_checked);
  c.counts["zero_groups_canonicalized"] = static_cast<int64_t>(r.zero_groups_canonicalized);
  c.counts["mismatches"] = static_cast<int64_t>(r.mismatches.total());
  if (r.warnings.total() > 0) c.counts["warnings"] = static_cast<int64_t>(r.warnings.total());
  AddFindings(r.mismatches, &c);
  AddWarnings(r.warnings, &c);
  c.findings_total = r.mismatches.total() + r.warnings.total();
  if (!r.mismatches.by_code().empty()) {
    evidence::Series s{"Pair mismatches by kind", "count", std::nullopt, std::nullopt, {}};
    for (const auto& [code, n] : r.mismatches.by_code()) {
      s.points.push_back({code, static_cast<int64_t>(n)});
    }
    c.series.push_back(std::move(s));
  }
  c.details.Set("derived_kind", r.derived_kind);
  c.details.Set("verdict", r.verdict());
  return c;
}

evidence::PairAudit PairAuditOf(const quant::PairVerifyResult& r) {
  evidence::PairAudit a;
  a.verdict = r.verdict();
  a.source_format = r.source_format;
  a.derived_format = r.derived_format;
  a.derived_kind = r.derived_kind;
  a.quantized_tensors = r.quantized_tensors;
  a.packed_bytes_compared = r.packed_bytes_compared;
  a.value_blocks_compared = r.value_blocks_compared;
  a.ignored_tensors_compared = r.ignored_tensors_compared;
  a.ignored_bytes_compared = r.ignored_bytes_compared;
  a.fused_groups_checked = r.fused_groups_checked;
  a.zero_groups_canonicalized = r.zero_groups_canonicalized;
  a.mismatches.total = r.mismatches.total();
  a.mismatches.by_code = r.mismatches.by_code();
  a.mismatches.cap = r.mismatches.cap();
  for (const quant::Finding& f : r.mismatches.kept()) a.mismatches.listed.push_back(FindingOf(f));
  a.warnings.total = r.warnings.total();
  a.warnings.by_code = r.warnings.by_code();
  a.warnings.cap = r.warnings.cap();
  for (const quant::Finding& f : r.warnings.kept()) a.warnings.listed.push_back(FindingOf(f));
  return a;
}

}  // namespace ckpt::audit
