#include "core/io/hf_layout.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/sha256.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

constexpr char kHfCache[] = ".cache/huggingface";
constexpr char kRepoPrefix[] = "models--";
constexpr uint64_t kMaxMetadataBytes = 4096;  // three short lines

// Characters of a hub repo name and of a revision's components.
bool IsRepoNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.'; }

bool IsHex(std::string_view s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The repository folder when `root` is `models--ORG--NAME/` itself or its `snapshots/`: neither
// is one snapshot.
std::shared_ptr<const io::Directory> RepoFolderAt(
    const std::shared_ptr<const io::Directory>& root) {
  auto is_repo = [](const io::Directory& d) {
    return absl::StartsWith(BaseName(d.label()), kRepoPrefix) && d.OpenDirectory("blobs").ok() &&
           d.OpenDirectory("snapshots").ok();
  };
  if (is_repo(*root)) return root;
  if (BaseName(root->label()) != "snapshots") return nullptr;
  auto parent = root->OpenParent();
  if (!parent.ok() || !is_repo(**parent)) return nullptr;
  return std::shared_ptr<const io::Directory>(*std::move(parent));
}

// A small file read whole through `dir` (no links); INVALID_ARGUMENT when over `max` bytes.
absl::StatusOr<std::string> ReadSmall(const io::Directory& dir, const std::string& relative,
                                      uint64_t max) {
  auto file = io::OpenRelative(dir, relative);
  if (!file.ok()) return file.status();
  auto id = (*file)->Identity();
  if (!id.ok()) return id.status();
  const std::string label = absl::StrCat(dir.label(), "/", relative);
  if (id->size > max) {
    return absl::InvalidArgumentError(absl::StrCat(EncodeName(label), ": ", id->size,
                                                   " bytes, more than ", max));
  }
  std::string text(id->size, '\0');
  std::span<uint8_t> out(reinterpret_cast<uint8_t*>(text.data()), text.size());
  if (auto s = io::ReadExactly(**file, 0, out, EncodeName(label)); !s.ok()) return s;
  return text;
}

bool SameInode(const absl::StatusOr<io::FileIdentity>& a, const absl::StatusOr<io::FileIdentity>& b) {
  return a.ok() && b.ok() && a->device == b->device && a->inode == b->inode;
}

// The repository folder when `root` is `models--ORG--NAME/snapshots/COMMIT` (".." twice: the
// real parents, whatever path the caller gave), with a `blobs/` folder; null otherwise.
std::shared_ptr<const io::Directory> HubRepoOf(const io::Directory& root) {
  auto snapshots = root.OpenParent();
  if (!snapshots.ok() || BaseName((*snapshots)->label()) != "snapshots") return nullptr;
  auto repo = (*snapshots)->OpenParent();
  if (!repo.ok() || !absl::StartsWith(BaseName((*repo)->label()), kRepoPrefix)) return nullptr;
  if (!SameInode((*snapshots)->StatAt(BaseName(root.label())), root.Identity()) ||
      !SameInode((*repo)->StatAt("snapshots"), (*snapshots)->Identity()) ||
      !(*repo)->OpenDirectory("blobs").ok()) {
    return nullptr;
  }
  return std::shared_ptr<const io::Directory>(*std::move(repo));
}

// huggingface_hub names the folder "models--" + the repo id with each '/' as "--".
std::string RepoIdOf(const std::string& folder) {
  return absl::StrReplaceAll(folder.substr(std::string_view(kRepoPrefix).size()), {{"--", "/"}});
}

DownloadMetadata ParseMetadata(const absl::StatusOr<std::string>& text) {
  DownloadMetadata m;
  if (!text.ok()) {
    m.error = std::string(text.status().message());
    return m;
  }
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  if (lines.size() < 3 || lines[0].empty() || lines[1].empty()) {
    m.error = "not three lines (commit, etag, timestamp)";
    return m;
  }
  m.commit = EncodeName(std::string(absl::StripAsciiWhitespace(lines[0])));
  m.etag = EncodeName(std::string(absl::StripAsciiWhitespace(lines[1])));
  m.timestamp = EncodeName(std::string(absl::StripAsciiWhitespace(lines[2])));
  return m;
}

// Reads each listed file's download metadata; files whose etag is a git blob id get theirs
// taken in the read. The commit is recorded when every metadata file names the same one.
void ReadDownloadMetadata(const io::Directory& cache, TreeListing* listing, LayoutInfo* info) {
  std::map<std::string, size_t> commits;
  for (TreeFile& f : listing->files) {
    auto text = ReadSmall(cache, absl::StrCat("download/", f.path, ".metadata"), kMaxMetadataBytes);
    if (absl::IsNotFound(text.status())) continue;
    DownloadMetadata m = ParseMetadata(text);
    f.git_blob_id = IsHex(m.etag, 40);
    if (!m.commit.empty()) commits[m.commit]++;
    info->metadata[f.path] = std::move(m);
  }
  if (commits.size() == 1) info->commit = commits.begin()->first;
}

absl::StatusOr<std::shared_ptr<io::LinkResolver>> GenericResolver(
    const std::shared_ptr<const io::Directory>& root, const LinkOptions& links) {
  std::vector<io::LinkBase> bases = {{root, root->label()}};
  for (const std::string& dir : links.confine) {
    auto opened = io::RealFileSystem().OpenRoot(dir);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("--confine: ", opened.status().message()));
    }
    std::shared_ptr<const io::Directory> d(*std::move(opened));
    bases.push_back({d, d->label()});
  }
  return std::make_shared<io::LinkResolver>(
      std::move(bases),
      links.confine.empty() ? "the root" : "the root and the --confine directories",
      links.allowed);
}

void AddFinding(std::vector<LayoutFinding>* out, std::string code, const ImageFile& f,
                std::string message, bool fails) {
  out->push_back({std::move(code), f.name, absl::StrCat(f.name, ": ", message), fails});
}

// `name` is a SHA-256 (64 hex) or a git blob id (40 hex) of `f`'s content: whether the read
// agrees; nullopt when the name is neither or the digest was not taken.
std::optional<bool> MatchesName(const ImageFile& f, const std::string& name) {
  if (IsHex(name, 64) && f.sha256) return ToHex(*f.sha256) == name;
  if (IsHex(name, 40) && f.git_blob_id) return ToHex(*f.git_blob_id) == name;
  return std::nullopt;
}

// For messages: the digest of `f` of the kind `name` is (see MatchesName).
std::string DigestLike(const ImageFile& f, const std::string& name) {
  if (IsHex(name, 40) && f.git_blob_id) return absl::StrCat("git blob id ", ToHex(*f.git_blob_id));
  return f.sha256 ? absl::StrCat("SHA-256 ", ToHex(*f.sha256)) : "";
}

void CheckSnapshot(const LayoutInfo& info, const TreeImage& image, std::vector<LayoutFinding>* out) {
  const std::string blobs = absl::StrCat(info.repo_path, "/blobs/");
  for (const ImageFile& f : image.files) {
    if (f.target.empty()) continue;  // a file copied into the snapshot: nothing names it
    const std::string blob = f.target.substr(std::min(f.target.size(), blobs.size()));
    if (!absl::StartsWith(f.target, blobs) || blob.find('/') != std::string::npos) {
      AddFinding(out, "link-not-to-blob", f,
                 absl::StrCat("links to ", EncodeName(f.target), ", not to a file in blobs/"),
                 false);
      continue;
    }
    std::optional<bool> match = MatchesName(f, blob);
    if (!match.has_value()) {
      AddFinding(out, "blob-name-unchecked", f,
                 absl::StrCat("blob ", EncodeName(blob),
                              " is named neither by a SHA-256 nor by a git blob id"),
                 false);
    } else if (!*match) {
      AddFinding(out, "blob-digest-mismatch", f,
                 absl::StrCat("blob ", blob, " holds content with ", DigestLike(f, blob),
                              ": not what the hub served under that name (a corrupted or "
                              "tampered cache)"),
                 true);
    }
  }
}

void CheckLocalDir(const LayoutInfo& info, const TreeImage& image, std::vector<LayoutFinding>* out) {
  std::map<std::string, size_t> commits;
  for (const ImageFile& f : image.files) {
    auto it = info.metadata.find(f.path);
    if (it == info.metadata.end()) {
      AddFinding(out, "no-download-metadata", f,
                 absl::StrCat("no ", kHfCache, "/download/", f.name,
                              ".metadata: not part of the download, or added after it"),
                 false);
      continue;
    }
    const DownloadMetadata& m = it->second;
    if (!m.error.empty()) {
      AddFinding(out, "download-metadata-unreadable", f, m.error, false);
      continue;
    }
    commits[m.commit]++;
    std::optional<bool> match = MatchesName(f, m.etag);
    if (!match.has_value()) {
      AddFinding(out, "etag-unchecked", f,
                 absl::StrCat("etag ", m.etag, " is neither a SHA-256 nor a git blob id"), false);
    } else if (!*match) {
      AddFinding(out, "etag-mismatch", f,
                 absl::StrCat(DigestLike(f, m.etag), ", but its download metadata records etag ", m.etag,
                              " (changed since it was downloaded, or corrupted)"),
                 true);
    }
  }
  if (commits.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [commit, n] : commits) parts.push_back(absl::StrCat(commit, " (", n, " files)"));
    out->push_back({"mixed-commits", "",
                    absl::StrCat("the download mixes ", commits.size(),
                                 " commits: ", absl::StrJoin(parts, ", ")),
                    true});
  }
}

}  // namespace

std::string_view TreeLayoutName(TreeLayout layout) {
  switch (layout) {
    case TreeLayout::kPlain: return "plain";
    case TreeLayout::kHubSnapshot: return "hf-cache-snapshot";
    case TreeLayout::kLocalDir: return "hf-local-dir";
  }
  return "plain";
}

std::string LayoutInfo::ModelRef() const {
  if (kind == TreeLayout::kHubSnapshot) return absl::StrCat(repo_id, "@", commit);
  return kind == TreeLayout::kLocalDir ? commit : "";
}

absl::StatusOr<LayoutListing> ListLayout(std::shared_ptr<const io::Directory> root,
                                         const LinkOptions& links, const TreeWalkOptions& walk) {
  LayoutListing out;
  out.walk = walk;
  LayoutInfo& info = out.layout;
  std::shared_ptr<const io::Directory> cache;
  if (std::shared_ptr<const io::Directory> repo = HubRepoOf(*root)) {
    info.kind = TreeLayout::kHubSnapshot;
    info.repo_path = repo->label();
    info.repo_id = EncodeName(RepoIdOf(BaseName(repo->label())));
    info.commit = EncodeName(BaseName(root->label()));
    auto refs = ReadSmall(*repo, "refs/main", 256);
    const std::string main = refs.ok() ? std::string(absl::StripAsciiWhitespace(*refs)) : "";
    if (IsHex(main, 40)) info.refs_main = main;
    out.resolver = std::make_shared<io::LinkResolver>(
        std::vector<io::LinkBase>{{repo, repo->label()}},
        absl::StrCat("the repository folder ", EncodeName(repo->label())), links.allowed);
  } else if (std::shared_ptr<const io::Directory> repo = RepoFolderAt(root)) {
    // The repository folder or its snapshots/: they share blobs, so which one is meant?
    const std::string main = [&] {
      auto refs = ReadSmall(*repo, "refs/main", 256);
      return refs.ok() ? std::string(absl::StripAsciiWhitespace(*refs)) : std::string();
    }();
    return absl::InvalidArgumentError(absl::StrCat(
        EncodeName(root->label()), ": a Hugging Face cache ",
        repo == root ? "repository folder" : "snapshots folder", "; audit one of its snapshots, ",
        EncodeName(repo->label()), "/snapshots/COMMIT",
        IsHex(main, 40) ? absl::StrCat(" (refs/main: snapshots/", main, ")") : ""));
  } else {
    auto hf = io::OpenSubdirectory(*root, kHfCache);
    if (hf.ok()) {
      info.kind = TreeLayout::kLocalDir;
      cache = *std::move(hf);
      out.walk.ignore_paths.push_back(kHfCache);
    }
    if (links.allow_symlinks) {
      auto resolver = GenericResolver(root, links);
      if (!resolver.ok()) return resolver.status();
      out.resolver = *std::move(resolver);
    }
  }
  out.walk.links = out.resolver.get();
  auto listing = ListTree(std::move(root), out.walk);
  if (!listing.ok()) return listing.status();
  out.listing = *std::move(listing);
  const std::string blobs = absl::StrCat(info.repo_path, "/blobs/");
  for (TreeFile& f : out.listing.files) {
    if (f.target.empty()) continue;
    info.links_followed++;
    if (info.kind == TreeLayout::kHubSnapshot && absl::StartsWith(f.target, blobs)) {
      f.git_blob_id = IsHex(BaseName(f.target), 40);
    }
  }
  if (cache != nullptr) ReadDownloadMetadata(*cache, &out.listing, &info);
  return out;
}

absl::StatusOr<LayoutListing> ListLayout(const std::string& root, const LinkOptions& links,
                                         const TreeWalkOptions& walk) {
  struct stat st;
  if (::stat(root.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    // One file: a plain tree of that file alone (what is read is what ListFile opened).
    auto listing = ListFile(root);
    if (!listing.ok()) return listing.status();
    LayoutListing out;
    out.listing = *std::move(listing);
    out.walk = walk;
    return out;
  }
  auto dir = io::RealFileSystem().OpenRoot(root);
  if (!dir.ok()) return dir.status();
  return ListLayout(std::shared_ptr<const io::Directory>(*std::move(dir)), links, walk);
}

std::optional<HubRepoRef> ParseHubRepoRef(std::string_view text) {
  const absl::string_view arg(text.data(), text.size());
  HubRepoRef ref;
  const size_t at = arg.find('@');
  const absl::string_view id = arg.substr(0, at);
  if (at != absl::string_view::npos) {
    ref.revision = std::string(arg.substr(at + 1));
    if (ref.revision.empty() || ref.revision.size() > 255) return std::nullopt;
    for (absl::string_view part : absl::StrSplit(ref.revision, '/')) {
      if (part.empty() || part == "." || part == ".." ||
          !std::all_of(part.begin(), part.end(), IsRepoNameChar)) {
        return std::nullopt;
      }
    }
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(id, '/');
  if (id.size() > 96 || parts.size() > 2 || absl::StrContains(id, "--") ||
      absl::StrContains(id, "..")) {
    return std::nullopt;
  }
  for (absl::string_view part : parts) {
    if (part.empty() || !absl::ascii_isalnum(part.front()) || !absl::ascii_isalnum(part.back()) ||
        !std::all_of(part.begin(), part.end(), IsRepoNameChar)) {
      return std::nullopt;
    }
  }
  ref.repo_id = std::string(id);
  return ref;
}

absl::StatusOr<HubSnapshotPath> FindHubSnapshot(const std::string& hub_cache,
                                                const HubRepoRef& ref) {
  const std::string asked = absl::StrCat(ref.repo_id, "@", ref.revision);
  auto cache = io::RealFileSystem().OpenRoot(hub_cache);
  if (!cache.ok()) {
    return absl::NotFoundError(absl::StrCat(asked, ": not a path here, and the Hugging Face cache ",
                                            EncodeName(hub_cache), " cannot be opened (",
                                            cache.status().message(), ")"));
  }
  const std::string folder =
      absl::StrCat(kRepoPrefix, absl::StrReplaceAll(ref.repo_id, {{"/", "--"}}));
  auto repo = io::OpenSubdirectory(**cache, folder);
  if (!repo.ok()) {
    return absl::NotFoundError(absl::StrCat(asked, ": not a path here, and the Hugging Face cache ",
                                            EncodeName(hub_cache), " has no ", folder,
                                            " (download it with `hf download ", ref.repo_id, "`)"));
  }
  std::string commit = ref.revision;
  if (!IsHex(commit, 40)) {
    auto text = ReadSmall(**repo, absl::StrCat("refs/", ref.revision), 256);
    if (!text.ok()) {
      return absl::NotFoundError(absl::StrCat(asked, ": ", EncodeName(hub_cache), "/", folder,
                                              " has no refs/", ref.revision, " (",
                                              text.status().message(), ")"));
    }
    commit = std::string(absl::StripAsciiWhitespace(*text));
    if (!IsHex(commit, 40)) {
      return absl::InvalidArgumentError(absl::StrCat(asked, ": ", EncodeName(hub_cache), "/",
                                                     folder, "/refs/", ref.revision,
                                                     " does not hold a commit hash"));
    }
  }
  const std::string snapshot = absl::StrCat("snapshots/", commit);
  if (auto dir = io::OpenSubdirectory(**repo, snapshot); !dir.ok()) {
    return absl::NotFoundError(absl::StrCat(asked, ": ", EncodeName(hub_cache), "/", folder,
                                            " has no ", snapshot, " (", dir.status().message(),
                                            ")"));
  }
  return HubSnapshotPath{absl::StrCat(hub_cache, "/", folder, "/", snapshot), commit};
}

std::vector<LayoutFinding> CheckLayout(const LayoutInfo& layout, const TreeImage& image) {
  std::vector<LayoutFinding> out;
  if (layout.kind == TreeLayout::kHubSnapshot) CheckSnapshot(layout, image, &out);
  if (layout.kind == TreeLayout::kLocalDir) CheckLocalDir(layout, image, &out);
  return out;
}

}  // namespace ckpt
