// libFuzzer target: ParseSafetensorsHeader on arbitrary bytes taken as a whole file.
//
// The parser must return a status (never crash, hang, or allocate from unvalidated header
// numbers) and, when it accepts, its tensors must tile the data buffer exactly: that
// invariant is re-checked here so the fuzzer also finds accepted-but-inconsistent headers.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  absl::StatusOr<ckpt::SafetensorsHeader> header =
      ckpt::ParseSafetensorsHeader(bytes, size, "fuzz");
  if (!header.ok()) return 0;
  uint64_t expected = 0;
  for (const ckpt::TensorInfo& t : header->tensors) {
    if (t.begin != expected || t.end < t.begin) std::abort();
    expected = t.end;
  }
  if (8 + header->header_len + expected != size) std::abort();
  return 0;
}
