// Keeps floating-point numbers out of signed JSON.
//
// nlohmann_json does not print floats canonically (RFC 8785), so two tools could disagree on
// the bytes of "the same" record. Signed payloads therefore carry only integers, strings,
// booleans and null; a value that needs a fraction is written as a decimal string.
#ifndef CKPT_CORE_EVIDENCE_JSON_GUARD_H_
#define CKPT_CORE_EVIDENCE_JSON_GUARD_H_

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

// INVALID_ARGUMENT naming the JSON pointer of the first float found.
absl::Status RejectFloats(const nlohmann::json& j);
absl::Status RejectFloats(const nlohmann::ordered_json& j);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_JSON_GUARD_H_
