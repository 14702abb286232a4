#include "core/evidence/base64.h"

#include <openssl/evp.h>

#include "absl/status/status.h"

namespace ckpt::evidence {

std::string Base64Encode(std::span<const uint8_t> bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes.data(),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

absl::StatusOr<std::vector<uint8_t>> Base64Decode(const std::string& text) {
  if (text.size() % 4 != 0) {
    return absl::InvalidArgumentError("base64: length is not a multiple of 4");
  }
  std::vector<uint8_t> out(text.size() / 4 * 3);
  int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return absl::InvalidArgumentError("base64: invalid character");
  // EVP_DecodeBlock keeps the bytes that padding stands for; drop them.
  size_t pad = 0;
  if (!text.empty() && text.back() == '=') ++pad;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  // Reject non-canonical encodings (stray bits, whitespace that OpenSSL skips) by re-encoding.
  if (Base64Encode(out) != text) return absl::InvalidArgumentError("base64: not canonical");
  return out;
}

}  // namespace ckpt::evidence
