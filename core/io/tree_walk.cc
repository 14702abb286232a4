#include "core/io/tree_walk.h"

#include <algorithm>

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

// Depth-first over `dir` (relative path `rel`, "" for the root). The entry types come from
// fstatat without following links: a link is reported as a link.
absl::Status Walk(const std::shared_ptr<const io::Directory>& dir, const std::string& label,
                  const std::string& rel, const TreeWalkOptions& options, TreeListing* out) {
  absl::StatusOr<std::vector<io::DirEntry>> entries = dir->List();
  if (!entries.ok()) return entries.status();
  for (const io::DirEntry& e : *entries) {
    std::string child_rel = rel.empty() ? e.name : absl::StrCat(rel, "/", e.name);
    if (Ignored(child_rel, options.ignore_paths)) continue;
    const std::string child_label = absl::StrCat(label, "/", child_rel);
    switch (e.type) {
      case io::EntryType::kSymlink: {
        if (options.links == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              child_label, ": symbolic link refused (model-signing rules: a link may point "
                           "outside the signed tree; see --allow-symlinks)"));
        }
        absl::StatusOr<io::ResolvedLink> to = options.links->Resolve(
            dir, rel.empty() ? label : absl::StrCat(label, "/", rel), e.name);
        if (!to.ok()) return to.status();
        out->files.push_back({child_rel, EncodeName(child_rel), to->size, to->parent, to->leaf,
                              to->target, false});
        out->links.insert(out->links.end(), to->hops.begin(), to->hops.end());
        break;
      }
      case io::EntryType::kDirectory: {
        absl::StatusOr<std::unique_ptr<io::Directory>> sub = dir->OpenDirectory(e.name);
        if (!sub.ok()) return sub.status();
        out->directories.push_back(child_rel);
        absl::Status s = Walk(std::shared_ptr<const io::Directory>(*std::move(sub)), label,
                              child_rel, options, out);
        if (!s.ok()) return s;
        break;
      }
      case io::EntryType::kRegular: {
        absl::StatusOr<io::FileIdentity> id = dir->StatAt(e.name);
        if (!id.ok()) return id.status();
        out->files.push_back({child_rel, EncodeName(child_rel), id->size, dir, e.name, "", false});
        break;
      }
      case io::EntryType::kOther:
        return absl::InvalidArgumentError(
            absl::StrCat(child_label, ": not a regular file or directory"));
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

absl::StatusOr<TreeListing> ListTree(std::shared_ptr<const io::Directory> root,
                                     const TreeWalkOptions& options) {
  TreeListing listing{root, {}, {}, {}};
  if (absl::Status s = Walk(root, root->label(), "", options, &listing); !s.ok()) return s;
  std::vector<std::string> paths;
  for (const TreeFile& f : listing.files) paths.push_back(f.path);
  if (absl::Status s = CheckNoEncodingCollisions(paths); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(EncodeName(root->label()), ": ", s.message()));
  }
  std::sort(listing.files.begin(), listing.files.end(),
            [](const TreeFile& a, const TreeFile& b) { return PosixPathLess(a.name, b.name); });
  std::sort(listing.directories.begin(), listing.directories.end(), PosixPathLess);
  return listing;
}

absl::StatusOr<TreeListing> ListTree(const std::string& root, const TreeWalkOptions& options) {
  absl::StatusOr<std::unique_ptr<io::Directory>> dir = io::RealFileSystem().OpenRoot(root);
  if (!dir.ok()) return dir.status();
  return ListTree(std::shared_ptr<const io::Directory>(*std::move(dir)), options);
}

absl::StatusOr<TreeListing> ListFile(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string leaf = slash == std::string::npos ? path : path.substr(slash + 1);
  if (leaf.empty() || leaf == "." || leaf == "..") {
    return absl::InvalidArgumentError(absl::StrCat(EncodeName(path), ": not a file name"));
  }
  absl::StatusOr<std::unique_ptr<io::Directory>> opened = io::RealFileSystem().OpenRoot(dir);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<const io::Directory> root(*std::move(opened));
  absl::StatusOr<io::FileIdentity> id = root->StatAt(leaf);
  if (!id.ok()) return id.status();
  return TreeListing{
      root, {}, {{leaf, EncodeName(leaf), id->size, root, leaf, "", false}}, {}, leaf};
}

}  // namespace ckpt
