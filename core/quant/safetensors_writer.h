// Writes one safetensors file (docs/formats.md §1) the way the reference writer lays it out:
// tensors sorted by dtype (descending, in the reference's dtype order) then name, offsets
// tiling the buffer from 0, the compact JSON header padded with spaces to a multiple of 8.
// Output written this way is byte-identical to `safetensors.torch.save_file` for our dtypes.
#ifndef CKPT_CORE_QUANT_SAFETENSORS_WRITER_H_
#define CKPT_CORE_QUANT_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/safetensors.h"

namespace ckpt::quant {

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::span<const uint8_t> bytes;  // borrowed (e.g. from a mapped source), or into `owned`
  std::vector<uint8_t> owned;

  static TensorToWrite Borrowed(const TensorInfo& info, std::span<const uint8_t> bytes);
  static TensorToWrite Owned(std::string name, DType dtype, std::vector<uint64_t> shape,
                             std::vector<uint8_t> bytes);
  std::span<const uint8_t> data() const { return owned.empty() ? bytes : std::span(owned); }
};

// One tensor's place in a file: `offset` (from the end of the header) and `size` in bytes are
// filled in by LayOutSafetensors; `index` is the caller's, carried along.
struct TensorSlot {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  size_t index = 0;
  uint64_t offset = 0, size = 0;
};

// The layout WriteSafetensors writes: `slots` sorted into file order with offsets and sizes
// (from dtype and shape), and the file's first bytes (8-byte length, padded JSON header), so a
// caller can write the tensor bytes itself (bench/scale writes them in parallel).
// INVALID_ARGUMENT for duplicate names.
struct SafetensorsLayout {
  std::string preamble;
  std::vector<TensorSlot> slots;
};
absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::string& path, std::vector<TensorSlot> slots,
    const std::map<std::string, std::string>& metadata);

// INVALID_ARGUMENT for duplicate names or a byte count that disagrees with dtype and shape;
// DATA_LOSS for I/O errors. The file is fsync'ed before returning.
absl::Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_SAFETENSORS_WRITER_H_
