// Standard base64 (RFC 4648 §4, with padding), as DSSE envelopes and tlog checkpoints use it.
#ifndef CKPT_CORE_EVIDENCE_BASE64_H_
#define CKPT_CORE_EVIDENCE_BASE64_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::evidence {

std::string Base64Encode(std::span<const uint8_t> bytes);
inline std::string Base64Encode(const std::string& s) {
  return Base64Encode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()),
                                               s.size()));
}
// INVALID_ARGUMENT for anything but canonical padded base64 (no whitespace, no URL alphabet).
absl::StatusOr<std::vector<uint8_t>> Base64Decode(const std::string& text);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_BASE64_H_
