#include "services/daemon/content_fingerprint.h"

#include "absl/strings/str_cat.h"
#include "core/fingerprint/oms_manifest.h"
#include "core/io/tree_walk.h"
#include "core/parallel.h"
#include "core/text/name_encoding.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kChunk = 64 << 10;

absl::Status CancelledGate() {
  return absl::CancelledError("gate cancelled: the caller left or its deadline passed");
}

absl::StatusOr<Digest> HashFile(const io::RandomAccessFile& file, const io::FileIdentity& before,
                                const std::string& shown, Progress& progress,
                                uint64_t* read_bytes) {
  Sha256 h;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(kChunk, before.size)));
  for (uint64_t offset = 0; offset < before.size;) {
    if (progress.Cancelled()) return CancelledGate();
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), before.size - offset));
    std::span<uint8_t> chunk(buf.data(), want);
    if (auto s = io::ReadExactly(file, offset, chunk, shown); !s.ok()) return s;
    h.Update(chunk);
    offset += want;
    *read_bytes += want;
    progress.Advance(want);
  }
  auto after = file.Identity();
  if (!after.ok() || !(*after == before)) {
    return absl::DataLossError(absl::StrCat(shown, ": changed while it was hashed"));
  }
  return h.Finish();
}

}  // namespace

std::vector<evidence::Subject> Content::Subjects() const {
  std::vector<evidence::Subject> subjects;
  subjects.reserve(files.size() + 1);
  for (const ContentFile& f : files) subjects.push_back({f.path, ToHex(f.sha256)});
  subjects.push_back({evidence::kManifestRootSubject, ToHex(manifest_root)});
  return subjects;
}

absl::StatusOr<Content> ContentFingerprinter::Fingerprint(
    std::shared_ptr<const io::Directory> root, Progress& progress,
    const LinkOptions& links) const {
  auto layout = ListLayout(std::move(root), links);
  if (!layout.ok()) return layout.status();
  TreeListing* listing = &layout->listing;

  Content content;
  content.root = listing->root_dir->label();
  content.files.resize(listing->files.size());
  uint64_t total = 0;
  for (const TreeFile& f : listing->files) {
    if (absl::Status s = evidence::CheckFileSubjectName(content.root, f.name); !s.ok()) return s;
    total += f.size;
  }
  progress.Begin("gate-fingerprint", total);
  // Every file, in parallel, each through its own descriptor.
  std::vector<uint64_t> read(listing->files.size(), 0);
  absl::Status s = ParallelFor(listing->files.size(), threads_, [&](size_t i) -> absl::Status {
    if (progress.Cancelled()) return CancelledGate();
    const TreeFile& f = listing->files[i];
    auto file = f.parent->OpenFile(f.leaf);
    if (!file.ok()) return file.status();
    auto identity = (*file)->Identity();
    if (!identity.ok()) return identity.status();
    ContentFile& out = content.files[i];
    out.path = f.name;
    out.identity = *identity;
    auto digest = HashFile(**file, out.identity, f.name, progress, &read[i]);
    if (!digest.ok()) return digest.status();
    out.sha256 = *digest;
    return absl::OkStatus();
  });
  progress.End();
  if (!s.ok()) return s;
  // Each followed link must still lead where it led when listed (docs/hf-layouts.md).
  if (auto links_now = io::CheckLinksUnchanged(listing->links); !links_now.ok()) return links_now;
  for (uint64_t r : read) content.hashed_bytes += r;

  std::vector<OmsResource> resources;
  resources.reserve(content.files.size());
  for (const ContentFile& f : content.files) {
    resources.push_back({f.path, 0, f.identity.size, f.sha256});
  }
  std::string name = EncodeName(content.root.substr(content.root.find_last_of('/') + 1));
  content.manifest_root = BuildOmsManifest(OmsMode::kFiles, 0, std::move(name),
                                           layout->walk.ignore_paths, std::move(resources))
                              .root;
  return content;
}

}  // namespace ckpt::daemon
