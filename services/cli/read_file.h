// Reading the small files CLI commands take as input (signatures, keys, certificates, proofs)
// through core/io/small_file.h: whole, with a size bound, a regular file and not a symbolic link,
// so a huge or endless input (a FIFO, /dev/zero) is an error, not an unbounded allocation.
#ifndef CKPT_SERVICES_CLI_READ_FILE_H_
#define CKPT_SERVICES_CLI_READ_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::cli {

// NOT_FOUND when there is none, INVALID_ARGUMENT when it holds more than max_bytes or is not a
// regular file, PERMISSION_DENIED for a symbolic link.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 64u << 20);

// Writes `text` to `path` through a temporary file in the same directory renamed into place, so
// a reader never sees half a file; the file gets `mode`.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text,
                                 mode_t mode = 0644);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_READ_FILE_H_
