// Tar layers (plain, gzip, zstd) of an OCI artifact, unpacked as their bytes arrive into files
// kept in memory (docs/interop.md, "OCI registries"). Only regular files and directories are
// accepted: a symbolic or hard link, a device or FIFO, a whiteout (`.wh.`), a name that is
// absolute, has a `..` component or is empty is INVALID_ARGUMENT naming the layer and the
// entry. So are headers whose name two common extractors read differently (docs/interop.md,
// "Tar headers"): a name prefix outside POSIX ustar, a pax path beside a GNU long name, names in
// global or sparse pax records, a regular file named with a trailing '/'; and a layer whose first
// bytes are not the compression its media type says (checked before any is decompressed). Each
// file kept (its contents, its name and a fixed 256 bytes of bookkeeping) is counted against a
// byte budget before it is allocated (RESOURCE_EXHAUSTED naming `--memory-window` when one does
// not fit); decompressed bytes that are not file contents (headers, padding, the archive's end)
// are bounded too.
#ifndef CKPT_CORE_OCI_TAR_LAYER_H_
#define CKPT_CORE_OCI_TAR_LAYER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::oci {

enum class Compression { kNone, kGzip, kZstd };

struct TarEntry {
  std::string path;  // cleaned: no leading "./", relative, no "." or ".." components
  std::shared_ptr<const std::vector<uint8_t>> bytes;
};

class TarLayer {
 public:
  // `label` names the layer in messages; `budget` is the bytes of files (contents, names and
  // bookkeeping) this and later layers may still keep (decremented as files are kept).
  TarLayer(std::string label, Compression compression, uint64_t* budget);
  ~TarLayer();
  TarLayer(const TarLayer&) = delete;
  TarLayer& operator=(const TarLayer&) = delete;

  absl::Status Feed(std::span<const uint8_t> compressed);
  // After the last byte: the archive must have ended (two zero blocks, or at least a complete
  // last entry) and the compressed stream too. Returns the files in archive order.
  absl::StatusOr<std::vector<TarEntry>> Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The cleaned form of an archive or annotation path, or INVALID_ARGUMENT naming `label`.
absl::StatusOr<std::string> CleanLayerPath(absl::string_view path, const std::string& label);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_TAR_LAYER_H_
