#include "services/daemon/content_fingerprint.h"

#include <chrono>

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

absl::StatusOr<Digest> ContentFingerprinter::HashShared(const std::string& key,
                                                        const io::RandomAccessFile& file,
                                                        const io::FileIdentity& identity,
                                                        bool stable, const std::string& shown,
                                                        Progress& progress, uint64_t* read_bytes) {
  std::shared_ptr<InFlight> flight;
  bool hashing_here = true;
  if (stable) {
    std::lock_guard<std::mutex> lock(mu_);
    auto cached = cache_.find(key);  // finished since this call stat'ed the file
    if (cached != cache_.end() && cached->second.stable && cached->second.identity == identity) {
      progress.Advance(identity.size);
      return cached->second.sha256;
    }
    auto it = in_flight_.find(key);
    if (it != in_flight_.end() && it->second->identity == identity) {
      flight = it->second;
      hashing_here = false;
    } else {
      flight = std::make_shared<InFlight>(identity);
      in_flight_[key] = flight;
    }
  }
  if (!hashing_here) {
    std::unique_lock<std::mutex> lock(flight->mu);
    while (!flight->done) {
      if (progress.Cancelled()) return CancelledGate();
      flight->done_cv.wait_for(lock, std::chrono::milliseconds(10));
    }
    if (flight->digest) {
      progress.Advance(identity.size);
      return *flight->digest;
    }
    flight = nullptr;  // that call failed or stopped: hash the file here
  }
  absl::StatusOr<Digest> digest = HashFile(file, identity, shown, progress, read_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (digest.ok()) {
    if (cache_.size() >= max_cached_) cache_.clear();
    cache_[key] = Cached{identity, *digest, stable};
  }
  if (flight != nullptr) {
    auto it = in_flight_.find(key);
    if (it != in_flight_.end() && it->second == flight) in_flight_.erase(it);
    std::lock_guard<std::mutex> done(flight->mu);
    flight->done = true;
    if (digest.ok()) flight->digest = *digest;
    flight->done_cv.notify_all();
  }
  return digest;
}

absl::StatusOr<Content> ContentFingerprinter::Fingerprint(
    std::shared_ptr<const io::Directory> root, Progress& progress, const LinkOptions& links) {
  auto layout = ListLayout(std::move(root), links);
  if (!layout.ok()) return layout.status();
  TreeListing* listing = &layout->listing;
  const absl::Time start = absl::Now();
  const int64_t stable_before = absl::ToUnixNanos(start - stable_age_);

  Content content;
  content.root = listing->root_dir->label();
  content.files.resize(listing->files.size());
  uint64_t total = 0;
  for (const TreeFile& f : listing->files) total += f.size;
  progress.Begin("gate-fingerprint", total);
  // Metadata first, on this thread: a file whose identity is cached costs one fstatat (no
  // symlink followed: a link swapped in has an inode of its own and cannot match).
  std::vector<size_t> changed;
  for (size_t i = 0; i < listing->files.size(); ++i) {
    if (progress.Cancelled()) return CancelledGate();
    const TreeFile& f = listing->files[i];
    ContentFile& out = content.files[i];
    out.path = f.name;
    auto identity = f.parent->StatAt(f.leaf);
    if (!identity.ok()) return identity.status();
    bool hit = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(absl::StrCat(content.root, "/", f.path));
      hit = it != cache_.end() && it->second.stable && it->second.identity == *identity;
      if (hit) out.sha256 = it->second.sha256;
    }
    if (hit) {
      out.identity = *identity;
      progress.Advance(identity->size);
    } else {
      changed.push_back(i);
    }
  }
  // Then the bytes of the files that changed, in parallel, each through its own descriptor.
  std::vector<uint64_t> read(changed.size(), 0);
  absl::Status s = ParallelFor(changed.size(), threads_, [&](size_t k) -> absl::Status {
    if (progress.Cancelled()) return CancelledGate();
    const TreeFile& f = listing->files[changed[k]];
    auto file = f.parent->OpenFile(f.leaf);
    if (!file.ok()) return file.status();
    auto identity = (*file)->Identity();
    if (!identity.ok()) return identity.status();
    ContentFile& out = content.files[changed[k]];
    out.identity = *identity;
    auto digest = HashShared(absl::StrCat(content.root, "/", f.path), **file, out.identity,
                             out.identity.ctime_ns <= stable_before, f.name, progress, &read[k]);
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
