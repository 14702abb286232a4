// Following symbolic links without leaving a set of directories (docs/hf-layouts.md).
//
// A link is resolved here, by this process, one component at a time, the way the kernel would
// resolve it: each component is looked up with readlinkat / openat(O_NOFOLLOW) under the
// descriptor of a directory opened before, a link met on the way has its text spliced in, and
// ".." steps back to the directory the walk came from (every directory on the way was opened as
// a directory, never through a link, so that is also where the kernel would go). The walk may
// only pass through the given base directories, what lies under them and the directories above
// them; a target anywhere else is PERMISSION_DENIED naming the link and where it leads. No path
// is ever handed to open() or realpath(), so a link swapped between the check and the read
// cannot redirect the read: the file is opened later through the descriptor of its parent
// directory that this walk returned, again with O_NOFOLLOW.
//
// Not thread-safe (it caches the directories it opened); one resolver per listing.
#ifndef CKPT_CORE_IO_CONFINED_LINKS_H_
#define CKPT_CORE_IO_CONFINED_LINKS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/file_system.h"

namespace ckpt::io {

// A directory links may lead into, opened once; `path` is its real path (Directory::label()).
struct LinkBase {
  std::shared_ptr<const Directory> dir;
  std::string path;
};

// One link followed: its directory, its name and the text it held when followed.
struct LinkHop {
  std::shared_ptr<const Directory> dir;
  std::string name;
  std::string text;
};

struct ResolvedLink {
  std::shared_ptr<const Directory> parent;  // the directory holding the target
  std::string leaf;                         // the target's name in it
  std::string target;                       // the target's real path
  uint64_t size = 0;
  std::vector<LinkHop> hops;  // every link followed on the way, in order
};

class LinkResolver {
 public:
  // `scope` says, in messages, where links may lead (e.g. "the repository folder /x").
  // `allowed`: when not empty, every target must also lie under one of these real paths (the
  // daemon's allow-list).
  LinkResolver(std::vector<LinkBase> bases, std::string scope,
               std::vector<std::string> allowed = {});

  // Resolves the link `name` in `dir`, whose real path is `dir_path` (under a base). The target
  // must be a regular file. PERMISSION_DENIED (outside the bases or the allow-list, a link to a
  // directory or a special file, more than kMaxLinks links), NOT_FOUND (a dangling link); the
  // message names the link and its target.
  absl::StatusOr<ResolvedLink> Resolve(std::shared_ptr<const Directory> dir,
                                       const std::string& dir_path, const std::string& name);

  static constexpr int kMaxLinks = 40;  // as the kernel's limit on nested links

 private:
  // The directory at absolute components `path`, which lies under base `b`, opened through
  // the base's descriptor (cached).
  absl::StatusOr<std::shared_ptr<const Directory>> DirectoryAt(const std::vector<std::string>& path,
                                                               const LinkBase& b);

  const std::vector<LinkBase> bases_;
  const std::string scope_;
  const std::vector<std::string> allowed_;
  std::map<std::string, std::shared_ptr<const Directory>> opened_;  // by real path
};

// DATA_LOSS naming the first link whose text changed (or that is gone) since it was followed.
absl::Status CheckLinksUnchanged(const std::vector<LinkHop>& hops);

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_CONFINED_LINKS_H_
