#include "core/evidence/strict_json.h"

#include "absl/strings/str_cat.h"
#include "core/text/json_parse.h"

namespace ckpt::evidence {

absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& label,
                                               const StrictJsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", text.size(), " bytes of JSON, more than ", limits.max_bytes));
  }
  // The one bounded parser (core/text/json_parse.h): linear time, duplicate keys, depth and a
  // byte-order mark refused.
  JsonLimits bounded;
  bounded.max_depth = limits.max_depth;
  return ParseBoundedJson(text, label, bounded);
}

}  // namespace ckpt::evidence
