#include "core/evidence/strict_json.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::evidence {
namespace {

struct Rejected {
  std::string why;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& label,
                                               const StrictJsonLimits& limits) {
  using json = nlohmann::json;
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", text.size(), " bytes of JSON, more than ", limits.max_bytes));
  }
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") {
    return absl::InvalidArgumentError(absl::StrCat(label, ": starts with a byte-order mark"));
  }
  std::vector<std::set<std::string>> keys;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= limits.max_depth) {
          throw Rejected{absl::StrCat("nested deeper than ", limits.max_depth, " levels")};
        }
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second) {
          throw Rejected{absl::StrCat("duplicate key '", key, "'")};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const Rejected& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", e.why));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not JSON: ", e.what()));
  }
}

}  // namespace ckpt::evidence
