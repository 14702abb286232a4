#include "core/quant/finding.h"

#include "absl/strings/str_cat.h"
#include "core/text/name_encoding.h"

namespace ckpt::quant {

nlohmann::json Finding::ToJson() const {
  nlohmann::json j = {{"code", code}, {"message", message}};
  if (!tensor.empty()) j["tensor"] = EncodeName(tensor);
  if (row >= 0) j["row"] = row;
  if (group >= 0) j["group"] = group;
  for (const auto& [k, v] : numbers) j[k] = v;
  return j;
}

std::string Finding::ToText() const {
  std::string where = EncodeName(tensor);
  if (row >= 0) absl::StrAppend(&where, where.empty() ? "" : " ", "row ", row);
  if (group >= 0) absl::StrAppend(&where, " group ", group);
  for (const auto& [k, v] : numbers) absl::StrAppend(&where, " ", k, "=", v);
  std::string s = code;
  if (!where.empty()) absl::StrAppend(&s, ": ", where);
  if (!message.empty()) absl::StrAppend(&s, ": ", message);
  return s;
}

void FindingList::Add(Finding f) {
  ++total_;
  ++by_code_[f.code];
  if (kept_.size() < cap_) kept_.push_back(std::move(f));
}

void FindingList::Merge(const FindingList& other, const std::string& prefix) {
  total_ += other.total_;
  for (const auto& [code, n] : other.by_code_) by_code_[prefix + code] += n;
  for (const Finding& f : other.kept_) {
    if (kept_.size() >= cap_) break;
    kept_.push_back(f);
    kept_.back().code = prefix + f.code;
  }
}

absl::StatusOr<FindingList> FindingList::Restore(size_t cap, std::vector<Finding> kept,
                                                 std::map<std::string, uint64_t> by_code) {
  FindingList list(cap);
  std::map<std::string, uint64_t> listed;
  for (const Finding& f : kept) ++listed[f.code];
  for (const auto& [code, n] : by_code) list.total_ += n;
  for (const auto& [code, n] : listed) {
    auto it = by_code.find(code);
    if (it == by_code.end() || it->second < n) {
      return absl::InvalidArgumentError(absl::StrCat("finding list: more '", code,
                                                     "' findings listed than counted"));
    }
  }
  if (kept.size() > cap) {
    return absl::InvalidArgumentError(absl::StrCat("finding list: ", kept.size(), " listed of ",
                                                   list.total_, " with a cap of ", cap));
  }
  list.kept_ = std::move(kept);
  list.by_code_ = std::move(by_code);
  return list;
}

uint64_t FindingList::count(const std::string& code) const {
  auto it = by_code_.find(code);
  return it == by_code_.end() ? 0 : it->second;
}

nlohmann::json FindingList::ToJson() const {
  nlohmann::json listed = nlohmann::json::array();
  for (const Finding& f : kept_) listed.push_back(f.ToJson());
  return {{"total", total_}, {"by_code", by_code_}, {"cap", cap_}, {"listed", listed}};
}

}  // namespace ckpt::quant
