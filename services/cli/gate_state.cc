#include "services/cli/gate_state.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/io/small_file.h"
#include "core/text/json_dump.h"
#include "core/text/json_parse.h"
#include "nlohmann/json.hpp"
#include "services/cli/evidence_paths.h"
#include "services/cli/read_file.h"

namespace ckpt::cli {
namespace {

constexpr char kFileName[] = "gate-decisions.json";
constexpr size_t kMaxEntries = 10000;  // the oldest go first beyond this
constexpr size_t kMaxFileBytes = 16u << 20;

std::tuple<std::string, std::string, std::string> Key(const GateQuestion& q) {
  return {q.root, q.policy, q.source};
}

}  // namespace

absl::StatusOr<GateState> GateState::Load() {
  auto dir = StateHome();
  if (!dir.ok()) return dir.status();
  GateState state;
  state.path_ = absl::StrCat(*dir, "/", kFileName);
  io::SmallFileRules rules;
  rules.what = "gate state file";
  rules.max_bytes = kMaxFileBytes;
  rules.forbidden_mode = 022;  // whoever can write it could make old decisions look new
  rules.owner_root_or_self = true;
  absl::StatusOr<std::string> text = io::ReadSmallFile(state.path_, rules);
  if (absl::IsNotFound(text.status())) return state;
  if (!text.ok()) return text.status();
  auto j = ParseBoundedJson(*text, state.path_);
  if (!j.ok()) return j.status();
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        state.path_, ": not a gate state file (expected {\"decisions\": [{root, policy, source, "
                     "time_ns}]})"));
  };
  if (!j->is_object() || !j->contains("decisions") || !(*j)["decisions"].is_array()) return bad();
  for (const auto& e : (*j)["decisions"]) {
    if (!e.is_object() || !e.contains("root") || !e["root"].is_string() ||
        !e.contains("policy") || !e["policy"].is_string() || !e.contains("source") ||
        !e["source"].is_string() || !e.contains("time_ns") ||
        !e["time_ns"].is_number_integer()) {
      return bad();
    }
    GateQuestion q{e["root"].get<std::string>(), e["policy"].get<std::string>(),
                   e["source"].get<std::string>()};
    state.newest_[Key(q)] = absl::FromUnixNanos(e["time_ns"].get<int64_t>());
  }
  return state;
}

std::optional<absl::Time> GateState::Newest(const GateQuestion& q) const {
  auto it = newest_.find(Key(q));
  if (it == newest_.end()) return std::nullopt;
  return it->second;
}

absl::Status GateState::Remember(const GateQuestion& q, absl::Time t) {
  absl::Time& held = newest_.try_emplace(Key(q), absl::InfinitePast()).first->second;
  if (t <= held) return absl::OkStatus();
  held = t;
  while (newest_.size() > kMaxEntries) {
    auto oldest = newest_.begin();
    for (auto it = newest_.begin(); it != newest_.end(); ++it) {
      if (it->second < oldest->second) oldest = it;
    }
    newest_.erase(oldest);
  }
  nlohmann::json decisions = nlohmann::json::array();
  for (const auto& [key, time] : newest_) {
    decisions.push_back({{"root", std::get<0>(key)},
                         {"policy", std::get<1>(key)},
                         {"source", std::get<2>(key)},
                         {"time_ns", absl::ToUnixNanos(time)}});
  }
  return WriteFileAtomically(path_, DumpJson(nlohmann::json{{"decisions", decisions}}, 1) + "\n",
                             0600);
}

}  // namespace ckpt::cli
