#include "services/cli/log_heads.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/evidence/ed25519.h"
#include "core/sha256.h"
#include "services/cli/evidence_paths.h"

namespace ckpt::cli {

absl::StatusOr<std::string> RememberedHeadFile(const std::string& origin) {
  auto home = StateHome();
  if (!home.ok()) return home.status();
  // The origin is read from the database, so it never becomes a path itself.
  const std::string dir = absl::StrCat(*home, "/heads");
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": cannot create: ", std::strerror(errno)));
  }
  return absl::StrCat(dir, "/", ToHex(Sha256Of(evidence::AsBytes(origin))));
}

absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> OpenLogReader(const std::string& db) {
  auto log = storage::EvidenceLog::OpenReadOnly(db);
  if (!log.ok()) return log.status();
  auto path = RememberedHeadFile((*log)->origin());
  if (!path.ok()) return path.status();
  auto remembered = storage::ReadHeadFile(*path);
  if (!remembered.ok()) return remembered.status();
  if (!*remembered) return log;
  absl::Status s = (*log)->InReadTransaction([&]() -> absl::Status {
    auto stored = storage::StoredHead(**log);
    if (!stored.ok()) return stored.status();
    return storage::CheckExtends(**log, (*remembered)->head, *stored);
  });
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(db, ": ", s.message(), "; the verified head is remembered in ", *path));
  }
  return log;
}

absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> OpenLogWriter(const std::string& db) {
  auto log = storage::EvidenceLog::Open(db, /*create=*/true);
  if (!log.ok()) return log.status();
  auto path = RememberedHeadFile((*log)->origin());
  if (!path.ok()) return path.status();
  if (auto s = (*log)->KeepHeadIn(*path); !s.ok()) return s;
  return log;
}

absl::Status RememberVerifiedHead(const storage::NodeReader& tree,
                                  const storage::SignedHead& newest) {
  auto path = RememberedHeadFile(newest.head.origin);
  if (!path.ok()) return path.status();
  auto remembered = storage::ReadHeadFile(*path);
  if (!remembered.ok()) return remembered.status();
  if (*remembered) {
    if (auto s = storage::CheckExtends(tree, (*remembered)->head, newest.head); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(s.message(), "; the verified head is remembered in ", *path));
    }
  }
  const uint64_t known = *remembered ? (*remembered)->head.size : 0;
  if (newest.head.size <= known) return absl::OkStatus();  // nothing newer (or an empty log)
  return storage::WriteHeadFile(*path, newest.note);
}

}  // namespace ckpt::cli
