// One bounded, linear-time JSON parser for everything read from a checkpoint: safetensors
// headers, config.json, the shard index and the X4T manifest (docs/reader.md).
//
// nlohmann's callback parser rescans the enclosing container after every value it closes,
// which made a 40k-tensor header take seconds; this builds the document from nlohmann's SAX
// events instead, in one pass, and enforces the limits while it reads: nesting depth, the
// number of top-level entries, no duplicate key in any object, no byte-order mark. Strings are
// valid UTF-8 (the lexer rejects anything else); trailing non-whitespace is an error.
#ifndef CKPT_CORE_TEXT_JSON_PARSE_H_
#define CKPT_CORE_TEXT_JSON_PARSE_H_

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ckpt {

struct JsonLimits {
  // Objects and arrays nested more than this many levels are refused (the outermost is level 1).
  int max_depth = 64;
  // Keys of the outermost object.
  size_t max_top_level_entries = std::numeric_limits<size_t>::max();
};

// Errors are INVALID_ARGUMENT "<label>: <rule>", one of: "invalid JSON: <parser message>",
// "JSON starts with a UTF-8 byte-order mark", "JSON nested deeper than N levels", "duplicate
// JSON key 'k' in the object at <JSON pointer>", "more than N top-level entries".
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, const std::string& label,
                                                const JsonLimits& limits = {});

}  // namespace ckpt

#endif  // CKPT_CORE_TEXT_JSON_PARSE_H_
