#include "core/fingerprint/tree_walk.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

bool Ignored(const std::string& rel, const std::vector<std::string>& ignore) {
  for (const std::string& p : ignore) {
    if (rel == p || (rel.size() > p.size() && rel.compare(0, p.size(), p) == 0 &&
                     rel[p.size()] == '/')) {
      return true;
    }
  }
  return false;
}

// Depth-first over `dir` (relative path `rel`, "" for the root). lstat, never stat: a link is
// reported as a link, not followed.
absl::Status Walk(const std::string& root, const std::string& rel,
                  const TreeWalkOptions& options, std::vector<TreeFile>* out) {
  std::string dir_path = rel.empty() ? root : absl::StrCat(root, "/", rel);
  DIR* dir = ::opendir(dir_path.c_str());
  if (dir == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir_path, ": cannot open directory: ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    std::string child_rel = rel.empty() ? name : absl::StrCat(rel, "/", name);
    if (Ignored(child_rel, options.ignore_paths)) continue;
    std::string child = absl::StrCat(root, "/", child_rel);
    struct stat st;
    if (::lstat(child.c_str(), &st) != 0) {
      return absl::DataLossError(
          absl::StrCat(child, ": cannot stat: ", std::strerror(errno)));
    }
    if (S_ISLNK(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          child, ": symbolic link refused (model-signing rules: a link may point outside the "
                 "signed tree)"));
    }
    if (S_ISDIR(st.st_mode)) {
      if (absl::Status s = Walk(root, child_rel, options, out); !s.ok()) return s;
    } else if (S_ISREG(st.st_mode)) {
      out->push_back(
          {child_rel, child, static_cast<uint64_t>(st.st_size), EncodeName(child_rel)});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(child, ": not a regular file or directory"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool PosixPathLess(const std::string& a, const std::string& b) {
  size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    if (a[i] == '/') return true;  // a's component ended first: shorter component sorts first
    if (b[i] == '/') return false;
    return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[i]);
  }
  return a.size() < b.size();
}

absl::StatusOr<TreeListing> ListTree(const std::string& root,
                                     const TreeWalkOptions& options) {
  char buf[PATH_MAX];
  struct stat st;
  if (::realpath(root.c_str(), buf) == nullptr || ::stat(buf, &st) != 0 ||
      !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(root, ": not a directory"));
  }
  TreeListing listing{buf, {}};
  if (absl::Status s = Walk(listing.root, "", options, &listing.files); !s.ok()) return s;
  std::vector<std::string> paths;
  paths.reserve(listing.files.size());
  for (const TreeFile& f : listing.files) paths.push_back(f.path);
  if (absl::Status s = CheckNoEncodingCollisions(paths); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(EncodeName(listing.root), ": ", s.message()));
  }
  std::sort(listing.files.begin(), listing.files.end(),
            [](const TreeFile& a, const TreeFile& b) { return PosixPathLess(a.name, b.name); });
  return listing;
}

}  // namespace ckpt
