// Fingerprints a checkpoint root for gates: every file's SHA-256, the OMS manifest ROOT and the
// subjects an audit record lists, re-reading only files whose identity changed since the last
// call (docs/daemon.md "Gate cost and change detection").
//
// A file's identity is (device, inode, size, mtime ns, ctime ns) from fstat of the descriptor
// that is hashed. The kernel sets ctime to the current time on every write, truncate, chmod,
// link and rename, and no system call lets a process set it; a changed file therefore shows a
// new ctime unless the system clock itself was turned back, which only root can do. Two changes
// within one timestamp tick look alike, so a digest is reused only when the file's ctime is
// older than kStableAge before the hash started (the same rule git uses for racily clean
// files); younger files are hashed again each time.
//
// Files are listed, stat'ed and opened through core/io (the root opened once, everything under
// it with openat/fstatat and O_NOFOLLOW), so a symlink swapped into the tree is refused, never
// followed. Only files whose identity is not cached are opened and read, in parallel; hashing
// polls Progress::Cancelled between 64 KiB reads (larger buffers, allocated per file, made the
// allocator keep their memory and the daemon's RSS grow under many concurrent gates).
//
// Concurrent gates on the same tree share the work: a file that one call is hashing is not read
// again by another that finds the same identity (with a ctime older than the stable age, the
// condition under which a finished digest would be reused); that one waits for the digest, and
// hashes the file itself only if the first call failed or stopped. A burst of gates on content
// the daemon has not hashed yet then reads it once, not once per call.
// Thread-safe.
#ifndef CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_
#define CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  uint64_t hashed_bytes = 0;       // bytes read by this call (0 when every digest was reused)

  // Every file digest plus the OMS manifest ROOT, as an audit record lists its subjects.
  std::vector<evidence::Subject> Subjects() const;
};

class ContentFingerprinter {
 public:
  static constexpr absl::Duration kStableAge = absl::Seconds(2);

  // `threads` hash changed files in parallel (0: all cores); a digest is reused only for a file
  // whose ctime is `stable_age` older than the hash; at most `max_cached` digests are
  // remembered (the cache starts over beyond that).
  explicit ContentFingerprinter(unsigned threads = 0, absl::Duration stable_age = kStableAge,
                                size_t max_cached = 1 << 18)
      : threads_(threads), stable_age_(stable_age), max_cached_(max_cached) {}

  // The tree under an opened root, listed by its layout (docs/hf-layouts.md) under `links`.
  // Errors: INVALID_ARGUMENT (a symlink or special file in the tree), PERMISSION_DENIED (a link
  // leaving what its layout or `links` allows), DATA_LOSS (a file changed while it was read),
  // CANCELLED.
  absl::StatusOr<Content> Fingerprint(std::shared_ptr<const io::Directory> root,
                                      Progress& progress, const LinkOptions& links = {});

 private:
  struct Cached {
    io::FileIdentity identity;
    Digest sha256{};
    bool stable = false;  // ctime was older than kStableAge when hashed
  };
  // A file being hashed by one call, which others with the same identity wait for.
  struct InFlight {
    explicit InFlight(const io::FileIdentity& id) : identity(id) {}
    const io::FileIdentity identity;
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;             // guarded by mu
    std::optional<Digest> digest;  // guarded by mu; nullopt when the hashing call failed
  };
  // The digest of the file at `key` (absolute path) with `identity`, read through `file`:
  // shared with a concurrent call hashing the same stable file, or hashed here.
  absl::StatusOr<Digest> HashShared(const std::string& key, const io::RandomAccessFile& file,
                                    const io::FileIdentity& identity, bool stable,
                                    const std::string& shown, Progress& progress,
                                    uint64_t* read_bytes);
  const unsigned threads_;
  const absl::Duration stable_age_;
  const size_t max_cached_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Cached> cache_;  // by absolute path; guarded by mu_
  std::unordered_map<std::string, std::shared_ptr<InFlight>> in_flight_;  // guarded by mu_
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_CONTENT_FINGERPRINT_H_
