// The files of a directory tree, listed the way OpenSSF model signing lists them.
//
// Every regular file under the root, recursively, named by its POSIX path relative to the
// root. Paths named in `ignore_paths` (relative to the root: the file itself or everything
// under a directory) are skipped; model_signing's defaults are `.git`, `.gitattributes`,
// `.github` and `.gitignore` at the root. Symbolic links and other non-regular entries are
// refused with an error naming the path, because a link can point outside what is signed.
// Any byte string is a valid name: each file also carries its recorded name (name encoding,
// docs/evidence.md), which is what the listing is sorted by.
#ifndef CKPT_CORE_FINGERPRINT_TREE_WALK_H_
#define CKPT_CORE_FINGERPRINT_TREE_WALK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

struct TreeWalkOptions {
  std::vector<std::string> ignore_paths = {".git", ".gitattributes", ".github", ".gitignore"};
};

struct TreeFile {
  std::string path;      // POSIX, relative to the root: the raw bytes, for opening
  std::string absolute;  // root realpath + "/" + path
  uint64_t size = 0;
  std::string name;      // EncodeName(path): what records and reports call the file
};

struct TreeListing {
  std::string root;             // realpath of the root, no trailing slash
  std::vector<TreeFile> files;  // sorted by PosixPathLess of name
};

// Errors: NOT_FOUND (no such directory), INVALID_ARGUMENT (a symlink or special file, named;
// two paths with the same recorded name, core/text/name_encoding.h).
absl::StatusOr<TreeListing> ListTree(const std::string& root,
                                     const TreeWalkOptions& options = {});

// Path order of model_signing (Python PurePosixPath): component by component, so "a/b" sorts
// before "a.b" even though '.' < '/' as bytes.
bool PosixPathLess(const std::string& a, const std::string& b);

}  // namespace ckpt

#endif  // CKPT_CORE_FINGERPRINT_TREE_WALK_H_
