// SHA-256 through OpenSSL 3 EVP (uses the CPU's SHA extensions where present).
#ifndef CKPT_CORE_SHA256_H_
#define CKPT_CORE_SHA256_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ckpt {

using Digest = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; one per thread.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::span<const uint8_t> bytes);
  Digest Finish();  // resets the hasher for reuse

 private:
  struct EvpCtx;
  EvpCtx* ctx_;
};

Digest Sha256Of(std::span<const uint8_t> bytes);
std::string ToHex(std::span<const uint8_t> bytes);
// Fills `out` with the bytes whose ToHex is `hex` (two lower-case hex digits a byte); false
// when `hex` is not that form of exactly out.size() bytes.
bool FromHex(std::string_view hex, std::span<uint8_t> out);

}  // namespace ckpt

#endif  // CKPT_CORE_SHA256_H_
