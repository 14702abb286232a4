// Fingerprints a checkpoint root for gates: every file's SHA-256, the OMS manifest ROOT and the
// subjects an audit record lists, from the bytes on disk during the call (docs/daemon.md "Gate
// cost and change detection").
//
// Every file is read and hashed on every call. No digest is reused on the strength of a file's
// stat identity (device, inode, size, mtime, ctime): a write through a shared mapping that is
// already dirty changes neither time on ext4, so an identity can stay the same while the bytes
// do not (issue 21). A digest may be trusted without reading only where the file cannot change
// underneath it (an fs-verity measurement); this build has no such cache (docs/daemon.md says
// why), so a gate costs one read of the whole tree.
//
// Files are listed, stat'ed and opened through core/io (the root opened once, everything under
// it with openat/fstatat and O_NOFOLLOW), so a symlink swapped into the tree is refused, never
// followed. Files are read in parallel; hashing polls Progress::Cancelled between 64 KiB reads
// (larger buffers, allocated per file, made the allocator keep their memory and the daemon's
// RSS grow under many concurrent gates). A file whose identity moved while it was read is
// DATA_LOSS. Thread-safe.
#ifndef CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_
#define CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/record.h"
#include "core/io/file_system.h"
#include "core/io/hf_layout.h"
#include "core/progress.h"
#include "core/sha256.h"

namespace ckpt::daemon {

struct ContentFile {
  std::string path;  // POSIX, relative to the root, in the name encoding records use
  io::FileIdentity identity;
  Digest sha256{};
};

struct Content {
  std::string root;                // real path of the root as opened (raw bytes)
  std::vector<ContentFile> files;  // PosixPathLess order
  Digest manifest_root{};          // OMS files-mode ROOT
  uint64_t hashed_bytes = 0;       // bytes read by this call

  // Every file digest plus the OMS manifest ROOT, as an audit record lists its subjects.
  std::vector<evidence::Subject> Subjects() const;
};

class ContentFingerprinter {
 public:
  // `threads` hash files in parallel (0: all cores).
  explicit ContentFingerprinter(unsigned threads = 0) : threads_(threads) {}

  // The tree under an opened root, listed by its layout (docs/hf-layouts.md) under `links`.
  // Errors: INVALID_ARGUMENT (a symlink or special file in the tree), PERMISSION_DENIED (a link
  // leaving what its layout or `links` allows), DATA_LOSS (a file changed while it was read),
  // CANCELLED.
  absl::StatusOr<Content> Fingerprint(std::shared_ptr<const io::Directory> root,
                                      Progress& progress, const LinkOptions& links = {}) const;

 private:
  const unsigned threads_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_
