// The files of a directory tree, listed the way OpenSSF model signing lists them.
//
// Every regular file under the root, recursively, named by its POSIX path relative to the
// root. Paths named in `ignore_paths` (relative to the root: the file itself or everything
// under a directory) are skipped; model_signing's defaults are `.git`, `.gitattributes`,
// `.github` and `.gitignore` at the root. Symbolic links and other non-regular entries are
// refused with an error naming the path, because a link can point outside what is signed.
// The walk goes through io::Directory handles (openat, no symlink following), and each file
// keeps the handle of its parent so it can be opened and re-stat'ed later without resolving
// its path again.
#ifndef CKPT_CORE_IO_TREE_WALK_H_
#define CKPT_CORE_IO_TREE_WALK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/file_system.h"

namespace ckpt {

struct TreeWalkOptions {
  std::vector<std::string> ignore_paths = {".git", ".gitattributes", ".github", ".gitignore"};
};

struct TreeFile {
  std::string path;  // POSIX, relative to the root: the raw bytes of the names
  std::string name;  // EncodeName(path) (core/text/name_encoding.h): what records call it
  uint64_t size = 0;
  std::shared_ptr<const io::Directory> parent;
  std::string leaf;  // last component of path, raw: opened under `parent`
};

struct TreeListing {
  std::shared_ptr<const io::Directory> root_dir;
  std::vector<std::string> directories;  // relative paths of every directory under the root
  std::vector<TreeFile> files;           // sorted by PosixPathLess of `name`
};

// Errors: INVALID_ARGUMENT (a symlink or special file, named; two paths with the same recorded
// name).
absl::StatusOr<TreeListing> ListTree(std::shared_ptr<const io::Directory> root,
                                     const TreeWalkOptions& options = {});
// Opens `root` on the real file system first. NOT_FOUND when it is not a directory.
absl::StatusOr<TreeListing> ListTree(const std::string& root, const TreeWalkOptions& options = {});

// Path order of model_signing (Python PurePosixPath): component by component, so "a/b" sorts
// before "a.b" even though '.' < '/' as bytes.
bool PosixPathLess(const std::string& a, const std::string& b);

}  // namespace ckpt

#endif  // CKPT_CORE_IO_TREE_WALK_H_
