// Parsing JSON that an adversary may have written, for the interoperability formats (Sigstore
// bundles, tlog proofs, provenance): a duplicate key in any object is an error (two parsers could
// otherwise read different values from the same bytes), nesting and size are bounded. The parse
// is the project's one bounded, linear-time parser (core/text/json_parse.h).
#ifndef CKPT_CORE_EVIDENCE_STRICT_JSON_H_
#define CKPT_CORE_EVIDENCE_STRICT_JSON_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

struct StrictJsonLimits {
  size_t max_bytes = 256u << 20;
  int max_depth = 32;
};

// INVALID_ARGUMENT naming `label` and the problem (syntax error, duplicate key, too deep/large).
absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, const std::string& label,
                                               const StrictJsonLimits& limits = {});

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_STRICT_JSON_H_
