// The files of a directory tree, listed the way OpenSSF model signing lists them.
//
// Every regular file under the root, recursively, named by its POSIX path relative to the
// root. Paths named in `ignore_paths` (relative to the root: the file itself or everything
// under a directory) are skipped; model_signing's defaults are `.git`, `.gitattributes`,
// `.github` and `.gitignore` at the root. Symbolic links and other non-regular entries are
// refused with an error naming the path, because a link can point outside what is signed.
// With a link resolver (core/io/confined_links.h; hub cache snapshots and --allow-symlinks,
// docs/hf-layouts.md) a link is instead followed under the resolver's rules: the file keeps the
// link's path and is read through the directory that holds its target.
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
#include "core/io/confined_links.h"
#include "core/io/file_system.h"

namespace ckpt {

struct TreeWalkOptions {
  std::vector<std::string> ignore_paths = {".git", ".gitattributes", ".github", ".gitignore"};
  io::LinkResolver* links = nullptr;  // not owned; null: every symlink is refused
};

struct TreeFile {
  std::string path;  // POSIX, relative to the root: the raw bytes of the names
  std::string name;  // EncodeName(path) (core/text/name_encoding.h): what records call it
  uint64_t size = 0;
  std::shared_ptr<const io::Directory> parent;
  std::string leaf;  // last component of path, raw: opened under `parent`
  std::string target;  // reached through a link: the real path of the file read; else empty
  bool git_blob_id = false;  // also take its git blob id in the read (core/git_blob_sha1.h)
};

struct TreeListing {
  std::shared_ptr<const io::Directory> root_dir;
  std::vector<std::string> directories;  // relative paths of every directory under the root
  std::vector<TreeFile> files;           // sorted by PosixPathLess of `name`
  std::vector<io::LinkHop> links;        // every link followed, to re-check at the end
  // A listing of one file (ListFile): its name in `root_dir`, the listing's only entry.
  std::string single_file;
};

// Errors: INVALID_ARGUMENT (a symlink without a resolver, or a special file, named; two paths
// with the same recorded name); the resolver's errors for a link it refuses.
absl::StatusOr<TreeListing> ListTree(std::shared_ptr<const io::Directory> root,
                                     const TreeWalkOptions& options = {});
// Opens `root` on the real file system first. NOT_FOUND when it is not a directory.
absl::StatusOr<TreeListing> ListTree(const std::string& root, const TreeWalkOptions& options = {});
// A listing of one file on the real file system: its directory is the root and the file, by
// its last component, the one entry (opened later without following a link, as any file).
absl::StatusOr<TreeListing> ListFile(const std::string& path);

// Path order of model_signing (Python PurePosixPath): component by component, so "a/b" sorts
// before "a.b" even though '.' < '/' as bytes.
bool PosixPathLess(const std::string& a, const std::string& b);

}  // namespace ckpt

#endif  // CKPT_CORE_IO_TREE_WALK_H_
