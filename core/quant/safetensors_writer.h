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

// Where WriteSafetensors puts every byte, from names, dtypes and shapes alone: a streaming
// writer (core/quant/transcode.h) places each tensor at its offset as it arrives.
struct TensorEntry {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
};
struct SafetensorsLayout {
  std::vector<uint8_t> prefix;       // the 8-byte header length and the padded JSON header
  std::vector<TensorEntry> tensors;  // in file order
  std::vector<uint64_t> offsets;     // absolute offset in the file, parallel to `tensors`
  std::vector<uint64_t> sizes;       // bytes, parallel to `tensors`
  uint64_t file_size = 0;
};
// Where the tensors' bytes lie: the reference writer's order, or the order given (other
// exporters write model order or their sharder's; the scale rig writes both, bench/scale).
enum class TensorOrder { kReference, kAsGiven };
// INVALID_ARGUMENT (naming `path`) for duplicate names or a shape that is no whole number of
// bytes.
absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::string& path, std::vector<TensorEntry> tensors,
    const std::map<std::string, std::string>& metadata,
    TensorOrder order = TensorOrder::kReference);

// INVALID_ARGUMENT for duplicate names or a byte count that disagrees with dtype and shape;
// DATA_LOSS for I/O errors. The file is fsync'ed before returning.
absl::Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_SAFETENSORS_WRITER_H_
