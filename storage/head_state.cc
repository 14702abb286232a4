#include "storage/head_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/io/fd.h"
#include "core/io/small_file.h"
#include "storage/log_verifier.h"

namespace ckpt::storage {
namespace {

using io::Fd;

constexpr size_t kMaxHeadFile = 64 << 10;  // a note is a few hundred bytes

std::string Errno(const std::string& path, const char* what) {
  return absl::StrCat(path, ": ", what, ": ", std::strerror(errno));
}

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string DescribeHead(const TreeHead& head) {
  return absl::StrCat("size ", head.size, " root ", ToHex(head.root));
}

absl::StatusOr<std::optional<SignedHead>> ReadHeadFile(const std::string& path) {
  io::SmallFileRules rules;
  rules.what = "tree head file";
  rules.max_bytes = kMaxHeadFile;
  rules.forbidden_mode = 022;  // whoever can write it decides which head is remembered
  rules.owner_root_or_self = true;
  absl::StatusOr<std::string> note = io::ReadSmallFile(path, rules);
  if (absl::IsNotFound(note.status())) return std::optional<SignedHead>();
  if (!note.ok()) return absl::FailedPreconditionError(note.status().message());
  auto head = ParseCheckpoint(*note);
  if (!head.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": not a tree head file: ",
                                            head.status().message()));
  }
  return std::optional<SignedHead>(SignedHead{*std::move(head), *std::move(note)});
}

absl::Status WriteHeadFile(const std::string& path, const std::string& note) {
  std::string tmp = absl::StrCat(path, ".tmp-XXXXXX");
  Fd fd(::mkstemp(tmp.data()));  // O_EXCL, mode 0600
  if (fd.get() < 0) return absl::DataLossError(Errno(tmp, "cannot create"));
  auto fail = [&](absl::Status s) {
    ::unlink(tmp.c_str());
    return s;
  };
  size_t put = 0;
  while (put < note.size()) {
    ssize_t n = ::write(fd.get(), note.data() + put, note.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(absl::DataLossError(Errno(tmp, "write")));
    put += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail(absl::DataLossError(Errno(tmp, "fsync")));
  if (!fd.Close()) return fail(absl::DataLossError(Errno(tmp, "close")));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::DataLossError(Errno(path, "rename")));
  }
  // The rename itself is durable only once the directory is.
  const std::string dir = DirectoryOf(path);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || ::fsync(dir_fd.get()) != 0) {
    return absl::DataLossError(Errno(dir, "fsync of the directory"));
  }
  return absl::OkStatus();
}

absl::Status CheckExtends(const NodeReader& tree, const TreeHead& older, const TreeHead& newer) {
  const std::string both = absl::StrCat("verified before: ", DescribeHead(older),
                                        "; the log now: ", DescribeHead(newer));
  if (older.origin != newer.origin) {
    return absl::FailedPreconditionError(absl::StrCat("the log's origin '", newer.origin,
                                                      "' is not the remembered log's '",
                                                      older.origin, "' (", both, ")"));
  }
  if (newer.size < older.size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log ", older.origin, " was rolled back: it holds fewer entries than a tree head verified "
        "before (", both, ")"));
  }
  if (newer.size == older.size && newer.root != older.root) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log ", older.origin, " forked: another tree of the same size was verified before (",
        both, ")"));
  }
  auto proof = ConsistencyProof(tree, older.size, newer.size);
  absl::Status s = proof.ok()
                       ? VerifyConsistency(older.size, newer.size, *proof, older.root, newer.root)
                       : proof.status();
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log ", older.origin, " is not consistent with a tree head verified before (", both,
        "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<SignedHead> NewestSignedHead(const EvidenceLog& log,
                                            const evidence::TrustStore& trust) {
  auto size = log.Size();
  if (!size.ok()) return size.status();
  if (*size == 0) return SignedHead{{log.origin(), 0, EmptyRoot()}, ""};
  auto latest = log.LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  auto head = VerifyCheckpoint(latest->second, log.origin(), trust);
  if (!head.ok()) return head.status();
  if (head->size != latest->first || head->size != *size) {
    return absl::FailedPreconditionError(
        absl::StrCat(log.label(), ": the log holds ", *size,
                     " entries but its newest signed checkpoint is for ", head->size));
  }
  return SignedHead{*std::move(head), latest->second};
}

absl::StatusOr<TreeHead> StoredHead(const EvidenceLog& log) {
  auto size = log.Size();
  if (!size.ok()) return size.status();
  auto root = log.RootAt(*size);
  if (!root.ok()) return root.status();
  return TreeHead{log.origin(), *size, *root};
}

namespace {

// Writes the head CheckHeadAtStart adopts. A file that cannot be written (a read-only
// filesystem, where the log serves reads only) is a warning, not a reason to refuse the log: the
// writer's appends wait for the head to be written (EvidenceLog::KeepHeadIn).
void Remember(const std::string& head_path, const std::string& note, HeadAtStart* out) {
  if (absl::Status s = WriteHeadFile(head_path, note); !s.ok()) {
    out->warning = true;
    absl::StrAppend(&out->message, "; not remembered: ", s.message());
    return;
  }
  out->adopted = true;
  absl::StrAppend(&out->message, "; remembered in ", head_path);
}

}  // namespace

absl::StatusOr<HeadAtStart> CheckHeadAtStart(const std::string& db_path,
                                             const std::string& head_path,
                                             const evidence::TrustStore& trust) {
  auto remembered = ReadHeadFile(head_path);
  if (!remembered.ok()) return remembered.status();
  auto log = EvidenceLog::OpenReadOnly(db_path);
  if (!log.ok()) {
    if (!absl::IsNotFound(log.status())) return log.status();
    if (!*remembered) return HeadAtStart{};  // a new log
    return absl::FailedPreconditionError(absl::StrCat(
        db_path, ": no evidence database, but the tree head ",
        DescribeHead((*remembered)->head), " of log ", (*remembered)->head.origin,
        " is remembered in ", head_path, "; refusing to start on a log that lost its entries"));
  }
  HeadAtStart out;
  if (!*remembered) {
    VerifiedLogState state;
    auto v = VerifyLogFrom(**log, trust, {}, &state);
    if (!v.ok()) return v.status();
    if (!v->ok()) {
      out.warning = true;
      out.message = absl::StrCat("no remembered tree head in ", head_path,
                                 " and the log does not verify (", v->problems.size(),
                                 " problems, the first: ", v->problems[0],
                                 "); no head remembered");
      return out;
    }
    if (state.size == 0) return out;  // nothing to remember until the first append
    out.message = absl::StrCat("no remembered tree head: verified the whole log (", v->entries,
                               " entries), its head is ",
                               DescribeHead({(*log)->origin(), state.size, state.root}));
    Remember(head_path, state.note, &out);
    return out;
  }
  const TreeHead& old = (*remembered)->head;
  SignedHead newest;
  absl::Status checked = (*log)->InReadTransaction([&]() -> absl::Status {
    auto h = NewestSignedHead(**log, trust);
    if (!h.ok()) return h.status();
    newest = *std::move(h);
    return CheckExtends(**log, old, newest.head);
  });
  if (!checked.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        db_path, ": ", checked.message(), "; remembered head ", DescribeHead(old), " (in ",
        head_path, "); refusing to start on a log that does not extend it"));
  }
  if (newest.head.size == old.size) {
    out.message = absl::StrCat("the log's newest signed head is the remembered one, ",
                               DescribeHead(old));
    return out;
  }
  out.message = absl::StrCat("the log extends the remembered head ", DescribeHead(old), " to ",
                             DescribeHead(newest.head), " (consistency proof verified)");
  Remember(head_path, newest.note, &out);
  return out;
}

}  // namespace ckpt::storage
