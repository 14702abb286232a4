// A strict reader of one safetensors file (format rules: docs/formats.md §1).
//
// It accepts exactly what the reference Rust reader (safetensors 0.8) accepts, except that
// duplicate JSON keys are always rejected, and so are two tensor names with one recorded form
// (core/text/name_encoding.h). Header numbers are validated against the file size before
// anything is sized by them; entry count and JSON depth are capped, and the header is read in
// one linear pass, entry by entry (core/text/json_parse.h). Every error is
// INVALID_ARGUMENT (malformed header) or DATA_LOSS (data region inconsistent with the header)
// and its message starts with the file path and names the tensor and the rule broken.
#ifndef CKPT_CORE_SAFETENSORS_H_
#define CKPT_CORE_SAFETENSORS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

enum class DType {
  kBool, kU8, kI8, kF8_E5M2, kF8_E4M3, kF8_E8M0, kF8_E4M3FNUZ, kF8_E5M2FNUZ,
  kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kI64, kU64, kF64, kC64,
  kF4, kF6_E2M3, kF6_E3M2,
};

// Exact spelling as in safetensors headers ("F8_E4M3"); nullopt for anything else.
std::optional<DType> ParseDType(std::string_view s);
std::string DTypeName(DType d);
// A shape as error messages write it: "[7168, 2048]".
std::string ShapeText(const std::vector<uint64_t>& shape);
int DTypeBits(DType d);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // [begin, end) relative to the data buffer
  uint64_t end = 0;

  uint64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100'000'000;  // the reference reader's limit
  size_t max_entries = 1'000'000;
  int max_json_depth = 8;
};

// The parsed header of a safetensors file; tensors are sorted by offset.
struct SafetensorsHeader {
  uint64_t header_len = 0;  // N: the data buffer starts at 8 + N
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the first bytes of a file of `file_size` bytes. `bytes` may be the
// whole file or just its prefix (at least 8 + N bytes). `label` prefixes error messages.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> bytes,
                                                         uint64_t file_size,
                                                         const std::string& label,
                                                         const SafetensorsLimits& limits = {});

// A parsed safetensors file and the bytes read of it (owned memory, never a mapping).
class SafetensorsFile {
 public:
  // `content` holds the file's bytes from offset 0: all of them, only the header (then Bytes()
  // is empty for every tensor), or none. `path` names the file in messages.
  SafetensorsFile(std::string path, SafetensorsHeader header,
                  std::shared_ptr<const std::vector<uint8_t>> content, uint64_t file_size);
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Reads a whole standalone file (e.g. an activations file) into memory and parses it.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path, const SafetensorsLimits& limits = {});
  // Reads only the 8-byte length and the header of a standalone file (Bytes() is empty).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenHeader(
      const std::string& path, const SafetensorsLimits& limits = {});

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_start() const { return 8 + header_.header_len; }

  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;
  // The tensor's bytes (no copy): from the kept content, or lent by a streamed read; empty when
  // neither holds them.
  std::span<const uint8_t> Bytes(const TensorInfo& t) const;

  // A streamed read (core/io/tree_stream.h) lends a tensor's bytes while some check needs them
  // and takes them back before freeing them. `t` is one of tensors(); `bytes` has its size.
  // Thread-safe; whoever hands work to another thread orders the lend before it.
  void Lend(const TensorInfo& t, const uint8_t* bytes) const;
  void Reclaim(const TensorInfo& t) const;

 private:
  const std::string path_;
  const SafetensorsHeader header_;
  const std::shared_ptr<const std::vector<uint8_t>> content_;
  const uint64_t file_size_;
  std::map<std::string_view, const TensorInfo*> by_name_;
  // Parallel to tensors(): bytes lent by a streamed read, or null.
  const std::unique_ptr<std::atomic<const uint8_t*>[]> lent_;
};

}  // namespace ckpt

#endif  // CKPT_CORE_SAFETENSORS_H_
