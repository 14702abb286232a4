#include "core/evidence/check_result.h"

#include <type_traits>

#include "core/text/name_encoding.h"

namespace ckpt::evidence {
namespace {

using ojson = nlohmann::ordered_json;

// The key order is the one records have carried since schema 2 (pinned by the golden payloads
// in tests/data/golden): code, what could not be read (status, path), the rest by name, fails.
ojson FindingJson(const Finding& f) {
  ojson j = {{"code", f.code}};
  if (!f.status.empty()) j["status"] = f.status;
  if (!f.path.empty()) j["path"] = f.path;
  std::map<std::string, ojson> by_name;
  by_name["message"] = f.message;
  if (!f.tensor.empty()) by_name["tensor"] = EncodeName(f.tensor);
  if (!f.hazard.empty()) by_name["hazard"] = f.hazard;
  if (f.row) by_name["row"] = *f.row;
  if (f.group) by_name["group"] = *f.group;
  if (f.layer) by_name["layer"] = *f.layer;
  for (const auto& [k, v] : f.numbers) by_name[k] = v;
  for (auto& [k, v] : by_name) j[k] = std::move(v);
  if (f.fails) j["fails"] = *f.fails;
  return j;
}

ojson SeriesJson(const Series& s) {
  ojson j = {{"title", s.title}, {"unit", s.unit}};
  if (s.limit) j["limit"] = *s.limit;
  if (s.warn) j["warn"] = *s.warn;
  ojson points = ojson::array();
  for (const Series::Point& p : s.points) points.push_back({{"label", p.label}, {"value", p.value}});
  j["points"] = std::move(points);
  return j;
}

ojson DetailJson(const DetailValue& v) {
  return std::visit(
      [](const auto& x) -> ojson {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, ScaleWindowThresholds>) {
          return ToJson(x);
        } else {
          return ojson(x);
        }
      },
      v);
}

ojson DetailsJson(const Details& d) {
  ojson j = ojson::object();
  for (const auto& [key, value] : d.entries()) j[key] = DetailJson(value);
  return j;
}

ojson SummaryJson(const FindingSummary& s) {
  ojson listed = ojson::array();
  for (const Finding& f : s.listed) listed.push_back(FindingJson(f));
  ojson by_code = ojson::object();
  for (const auto& [code, n] : s.by_code) by_code[code] = n;
  return {{"by_code", by_code}, {"cap", s.cap}, {"listed", listed}, {"total", s.total}};
}

}  // namespace

std::string VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kPass: return "pass";
    case Verdict::kFail: return "fail";
    case Verdict::kSkipped: return "skipped";
  }
  return "?";
}

ojson ToJson(const ScaleWindowThresholds& t) {
  return {{"id", t.name + "/" + std::to_string(t.version)},
          {"marlin_min_scale_log2", t.marlin_min_scale_log2},
          {"marlin_span", t.marlin_span},
          {"max_listed", t.max_listed},
          {"max_span", t.max_span},
          {"name", t.name},
          {"version", t.version}};
}

void Details::Set(std::string key, DetailValue value) {
  for (auto& [k, v] : entries_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

const DetailValue* Details::Find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Details::String(std::string_view key) const {
  const DetailValue* v = Find(key);
  const std::string* s = v == nullptr ? nullptr : std::get_if<std::string>(v);
  return s == nullptr ? "" : *s;
}

ojson CheckResult::ToJson() const {
  ojson j = {{"name", name}, {"verdict", VerdictName(verdict)}};
  j["counts"] = ojson::object();
  for (const auto& [k, v] : counts) j["counts"][k] = v;
  j["findings_total"] = findings_total.value_or(findings.size());
  j["findings"] = ojson::array();
  for (size_t i = 0; i < findings.size() && i < kMaxFindings; ++i) {
    j["findings"].push_back(FindingJson(findings[i]));
  }
  if (!series.empty()) {
    j["series"] = ojson::array();
    for (const Series& s : series) j["series"].push_back(SeriesJson(s));
  }
  if (!details.empty()) j["details"] = DetailsJson(details);
  return j;
}

ojson PairAudit::ToJson() const {
  ojson j = {{"derived_format", derived_format},
             {"derived_kind", derived_kind},
             {"fused_groups_checked", fused_groups_checked},
             {"ignored_bytes_compared", ignored_bytes_compared},
             {"ignored_tensors_compared", ignored_tensors_compared},
             {"mismatches", SummaryJson(mismatches)},
             {"packed_bytes_compared", packed_bytes_compared},
             {"quantized_tensors", quantized_tensors},
             {"source_format", source_format},
             {"value_blocks_compared", value_blocks_compared},
             {"verdict", verdict}};
  // Only when there are some: the records of every earlier pair audit read as before.
  if (warnings.total > 0) j["warnings"] = SummaryJson(warnings);
  j["zero_groups_canonicalized"] = zero_groups_canonicalized;
  return j;
}

}  // namespace ckpt::evidence
