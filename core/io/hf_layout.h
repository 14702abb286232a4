// Where checkpoints live after a Hugging Face download, and what those layouts prove
// (docs/hf-layouts.md).
//
// ListLayout lists a checkpoint root the way its layout asks:
//  - a hub cache snapshot (`models--ORG--NAME/snapshots/COMMIT/`): its files are relative
//    links into `../../blobs/`; each is followed (core/io/confined_links.h) only to a regular
//    file inside the same `models--ORG--NAME/` folder, and keeps its snapshot path, so the OMS
//    ROOT is the one of the same files copied into a plain directory;
//  - a `--local-dir` download: `.cache/huggingface/` is left out of the listing (and recorded
//    in the OMS ignore_paths), and each file's `download/F.metadata` is read;
//  - any other tree: links refused, unless `LinkOptions::allow_symlinks`, then followed when
//    they stay under the root or a `confine` directory.
// Files whose hub name or etag is a git blob id are marked so that the one read takes that id
// too; CheckLayout compares every name and etag with the digests that read computed.
#ifndef CKPT_CORE_IO_HF_LAYOUT_H_
#define CKPT_CORE_IO_HF_LAYOUT_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/io/confined_links.h"
#include "core/io/tree_image.h"
#include "core/io/tree_walk.h"

namespace ckpt {

struct LinkOptions {
  bool allow_symlinks = false;        // generic trees: follow links that stay confined
  std::vector<std::string> confine;   // directories links may lead into, besides the root
  std::vector<std::string> allowed;   // not empty: every link target must lie under one (daemon)
};

enum class TreeLayout { kPlain, kHubSnapshot, kLocalDir };
// "plain", "hf-cache-snapshot", "hf-local-dir".
std::string_view TreeLayoutName(TreeLayout layout);

// One `.cache/huggingface/download/F.metadata`: commit hash, etag, Unix time, one a line.
struct DownloadMetadata {
  std::string commit;
  std::string etag;
  std::string timestamp;
  std::string error;  // why it could not be read; the fields are then empty
};

struct LayoutInfo {
  TreeLayout kind = TreeLayout::kPlain;
  std::string repo_id;    // hub: ORG/NAME from the folder name (name-encoded)
  std::string commit;     // hub: the snapshot's name; local-dir: the commit every file agrees on
  std::string refs_main;  // hub: what refs/main holds (a commit hash), empty when absent
  std::string repo_path;  // hub: real path of models--ORG--NAME
  std::map<std::string, DownloadMetadata> metadata;  // local-dir: by raw file path, when present
  size_t links_followed = 0;

  // "ORG/NAME@COMMIT" for a snapshot, the commit for a single-commit local-dir, else empty.
  std::string ModelRef() const;
};

struct LayoutListing {
  TreeListing listing;
  TreeWalkOptions walk;  // ignore_paths as recorded in the OMS manifest (links: not owned)
  LayoutInfo layout;
  std::shared_ptr<io::LinkResolver> resolver;  // what `walk.links` pointed to
};

// Errors: those of ListTree; PERMISSION_DENIED naming a link and its target when a link leaves
// what its layout allows.
absl::StatusOr<LayoutListing> ListLayout(std::shared_ptr<const io::Directory> root,
                                         const LinkOptions& links = {},
                                         const TreeWalkOptions& walk = {});
// A path naming a regular file lists that file alone (TreeListing::single_file, a plain tree).
absl::StatusOr<LayoutListing> ListLayout(const std::string& root, const LinkOptions& links = {},
                                         const TreeWalkOptions& walk = {});

// What the layout's own records say against the bytes read. `fails`: the cache or download
// does not hold what the hub served (tampered or corrupted) or mixes commits; other findings
// are reported without failing.
struct LayoutFinding {
  std::string code;
  std::string path;  // recorded name of the file concerned, or empty
  std::string message;
  bool fails = false;
};
std::vector<LayoutFinding> CheckLayout(const LayoutInfo& layout, const TreeImage& image);

// A Hugging Face repo id as a checkpoint argument (docs/hf-layouts.md "Repo ids"):
// ORG/NAME or NAME, optionally @REVISION (a branch, tag, refs/pr/N or a commit hash).
struct HubRepoRef {
  std::string repo_id;
  std::string revision = "main";
};
// nullopt unless `arg` has that shape: the hub's name rules (letters, digits, '-', '_', '.';
// no "--" or ".."; at most 96 characters) and a revision without ".." or empty components.
std::optional<HubRepoRef> ParseHubRepoRef(std::string_view arg);

// The snapshot the hub cache `hub_cache` holds for `ref`, found as huggingface_hub finds it:
// models--ORG--NAME/snapshots/COMMIT, COMMIT being the revision when it is a commit hash, else
// what refs/REVISION holds. NOT_FOUND naming the cache and what is missing.
struct HubSnapshotPath {
  std::string path;
  std::string commit;
};
absl::StatusOr<HubSnapshotPath> FindHubSnapshot(const std::string& hub_cache,
                                                const HubRepoRef& ref);

}  // namespace ckpt

#endif  // CKPT_CORE_IO_HF_LAYOUT_H_
