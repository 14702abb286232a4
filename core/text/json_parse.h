// One bounded, linear-time JSON parser for everything read from a checkpoint: safetensors
// headers, config.json, the shard index and the X4T manifest (docs/reader.md).
//
// nlohmann's callback parser rescans the enclosing container after every value it closes,
// which made a 40k-tensor header take seconds; this builds values from nlohmann's SAX events
// instead, in one pass, and enforces the limits while it reads: nesting depth, the number of
// top-level entries, no duplicate key in any object, no byte-order mark. Strings are valid
// UTF-8 (the lexer rejects anything else); trailing non-whitespace is an error.
#ifndef CKPT_CORE_TEXT_JSON_PARSE_H_
#define CKPT_CORE_TEXT_JSON_PARSE_H_

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ckpt {

struct JsonLimits {
  // Objects and arrays nested more than this many levels are refused (the outermost is level 1).
  int max_depth = 64;
  // Keys of the outermost object.
  size_t max_top_level_entries = std::numeric_limits<size_t>::max();
};

// The whole document. Errors are INVALID_ARGUMENT "<label>: <rule>", one of: "invalid JSON:
// <parser message>", "JSON starts with a UTF-8 byte-order mark", "JSON nested deeper than N
// levels", "duplicate JSON key 'k' in the object at <JSON pointer>", "more than N top-level
// entries".
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, const std::string& label,
                                                const JsonLimits& limits = {});

// Called with each member of the outermost object as soon as its value is complete; an error
// stops the parse and is returned as is.
using JsonEntryVisitor = std::function<absl::Status(std::string key, nlohmann::json value)>;

// The same rules for a document that must be an object, without ever holding all of it: a
// header of 100k tensors is visited entry by entry. Also INVALID_ARGUMENT "<label>: JSON is not
// an object". An entry may have been visited before a later syntax error is found.
absl::Status ParseBoundedJsonObject(std::string_view text, const std::string& label,
                                   const JsonLimits& limits, const JsonEntryVisitor& on_entry);

}  // namespace ckpt

#endif  // CKPT_CORE_TEXT_JSON_PARSE_H_
