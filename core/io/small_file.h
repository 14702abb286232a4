// The one reader of the small files that configure or authorise something: bearer tokens and
// token stores, signing and TLS keys, certificates, trust files, proofs and other inputs the CLI
// and the daemon read whole (docs/daemon.md "Small files").
//
// A file is read whole or not at all: more than the caller's cap is an error, never a silent
// truncation; only a regular file is read (a FIFO, device or directory planted at the path is
// refused at once, without blocking); a symbolic link as the last component is refused unless
// the caller allows it (secret volumes mount keys as links), and the mode and owner rules the
// caller asks for are checked on the opened descriptor, so they hold for the bytes read, not for
// whatever the name pointed to a moment before.
#ifndef CKPT_CORE_IO_SMALL_FILE_H_
#define CKPT_CORE_IO_SMALL_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::io {

struct SmallFileRules {
  const char* what = "file";  // names the file in messages: "token file", "private key"
  size_t max_bytes = 1 << 20;
  // Permission bits that must be clear: 077 for a secret, 022 for a file that decides whom to
  // trust (whoever can write it decides).
  mode_t forbidden_mode = 0;
  bool owner_root_or_self = false;  // owned by root or by this process's effective user
  bool follow_link = false;         // a symbolic link at the path is followed, not refused
};

// The whole content of the file at `path`. NOT_FOUND when there is none; PERMISSION_DENIED for
// a refused link or an open the system denies; INVALID_ARGUMENT for a non-regular file or one
// over rules.max_bytes; FAILED_PRECONDITION naming the mode or owner when a rule is broken;
// DATA_LOSS on a read error. Every message starts with `path`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const SmallFileRules& rules);

// The same checks and read on a descriptor the caller opened (for example one it holds a lock
// on), from offset 0; `path` names it in messages. The descriptor stays open.
absl::StatusOr<std::string> ReadSmallFile(int fd, const std::string& path,
                                          const SmallFileRules& rules);

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_SMALL_FILE_H_
