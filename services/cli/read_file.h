// Reading the small files CLI commands take as input (signatures, keys, certificates, proofs):
// whole, with a size bound, so a huge or endless input (a FIFO, /dev/zero) is an error, not an
// unbounded allocation.
#ifndef CKPT_SERVICES_CLI_READ_FILE_H_
#define CKPT_SERVICES_CLI_READ_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::cli {

// NOT_FOUND when it cannot be opened, INVALID_ARGUMENT when it holds more than max_bytes.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 64u << 20);

// Writes `text` to `path` through a temporary file in the same directory renamed into place, so
// a reader never sees half a file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_READ_FILE_H_
