// The one way this project turns a JSON value into text: signed payloads, CLI output, reports.
//
// nlohmann's dump() throws on a string that is not valid UTF-8, and names, roots and messages
// can carry any bytes a file system allows. DumpJson never throws: a string or key that is not
// valid UTF-8 is written in the name encoding (core/text/name_encoding.h), so the output is
// deterministic and says which bytes were there. Names meant for a record are encoded (and
// checked for collisions) before they get here; this is the guarantee for everything else.
#ifndef CKPT_CORE_TEXT_JSON_DUMP_H_
#define CKPT_CORE_TEXT_JSON_DUMP_H_

#include <string>

#include "nlohmann/json.hpp"

namespace ckpt {

// As nlohmann's dump(indent): compact with indent -1, else pretty-printed with `indent` spaces.
// With `ensure_ascii`, every character beyond ASCII is written as a \uXXXX escape, as Python's
// json.dumps does by default (formats other tools re-serialize byte for byte, e.g. model_signing
// statements).
std::string DumpJson(const nlohmann::json& j, int indent = -1, bool ensure_ascii = false);
std::string DumpJson(const nlohmann::ordered_json& j, int indent = -1, bool ensure_ascii = false);

}  // namespace ckpt

#endif  // CKPT_CORE_TEXT_JSON_DUMP_H_
