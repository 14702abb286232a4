#include "core/io/tree_image.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/io/file_hashers.h"
#include "core/parallel.h"

namespace ckpt {
namespace {

constexpr uint64_t kChunk = 8ull << 20;

bool IsSafetensors(const std::string& path) { return absl::EndsWith(path, ".safetensors"); }

// X4T container A keeps per-layer scale streams in `x4t-layer-*.safetensors` at the root
// (docs/formats.md); their checks read whole files, so a streamed audit keeps them whole.
bool IsX4TSidecar(const std::string& path) {
  return absl::StartsWith(path, "x4t-layer-") && IsSafetensors(path) &&
         path.find('/') == std::string::npos;
}


// Whole files kept in memory under these options (safetensors headers under kMetadata are
// kept too, but are bounded by the header limit and not counted against the window).
bool KeepsWhole(const ImageFile& f, const ReadOptions& o) {
  switch (o.keep) {
    case ReadOptions::Keep::kNothing: return false;
    case ReadOptions::Keep::kEverything: return true;
    case ReadOptions::Keep::kMetadata: return !IsSafetensors(f.path) && f.size() <= o.max_small_file;
    case ReadOptions::Keep::kStreamTensorData:
      return IsX4TSidecar(f.path) || (!IsSafetensors(f.path) && f.size() <= o.max_small_file);
  }
  return false;
}

// Under kStreamTensorData the data of this file is left for StreamTrees.
bool Defers(const ImageFile& f, const ReadOptions& o) {
  return o.keep == ReadOptions::Keep::kStreamTensorData && IsSafetensors(f.path) &&
         !IsX4TSidecar(f.path);
}

bool HashesEverything(const ReadOptions& o) {
  return o.file_digests || o.tensor_digests || o.range_size > 0;
}

class FileReader {
 public:
  FileReader(const std::string& root, const ReadOptions& o, Progress& progress)
      : root_(root), options_(o), progress_(progress) {}

  // Reads `f` once; fills its digests, header and kept content. Returns the bytes read.
  absl::StatusOr<uint64_t> Read(ImageFile* f) {
    const std::string label = absl::StrCat(root_, "/", f->path);
    absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> opened = f->parent->OpenFile(f->leaf);
    if (!opened.ok()) return opened.status();
    const io::RandomAccessFile& file = **opened;
    absl::StatusOr<io::FileIdentity> id = file.Identity();
    if (!id.ok()) return id.status();
    f->identity = *id;
    const uint64_t size = id->size;
    const bool whole = KeepsWhole(*f, options_);
    // Bytes go straight into `kept` when the file is kept, else through `scratch`.
    std::vector<uint8_t> kept, scratch;
    if (whole) kept.resize(size);
    io_internal::FileHashers hashers(options_, size, f->wants_git_blob_id);
    uint64_t pos = 0;
    auto consume = [&](uint64_t n) -> absl::StatusOr<std::span<const uint8_t>> {
      if (progress_.Cancelled()) return absl::CancelledError(absl::StrCat(label, ": read cancelled"));
      std::span<uint8_t> dst;
      if (whole) {
        dst = std::span<uint8_t>(kept).subspan(pos, n);
      } else {
        scratch.resize(n);
        dst = scratch;
      }
      if (absl::Status s = io::ReadExactly(file, pos, dst, label); !s.ok()) return s;
      hashers.Update(pos, dst);
      file.Consumed(pos, n);
      progress_.Advance(n);
      pos += n;
      return dst;
    };

    std::vector<uint8_t> header;
    if (IsSafetensors(f->path) && size >= 8) {
      // The 8-byte length, then the header JSON, parsed from the bytes just read.
      absl::StatusOr<std::span<const uint8_t>> len = consume(8);
      if (!len.ok()) return len.status();
      header.assign(len->begin(), len->end());
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | header[i];
      if (n <= options_.limits.max_header_bytes && n <= size - 8) {
        absl::StatusOr<std::span<const uint8_t>> json = consume(n);
        if (!json.ok()) return json.status();
        header.insert(header.end(), json->begin(), json->end());
      }
    }
    if (IsSafetensors(f->path)) {
      absl::StatusOr<SafetensorsHeader> parsed =
          ParseSafetensorsHeader(header, size, label, options_.limits);
      if (parsed.ok()) {
        f->safetensors =
            std::make_shared<const SafetensorsFile>(label, *std::move(parsed), nullptr, size);
        if (options_.tensor_digests) hashers.SetTensors(f->safetensors.get(), &f->tensor_digests);
      } else {
        f->header_status = parsed.status();  // hashed as plain bytes; the checks report it
      }
    }
    const bool defer = Defers(*f, options_);
    if ((HashesEverything(options_) || whole) && !defer) {
      while (pos < size) {
        absl::StatusOr<std::span<const uint8_t>> chunk = consume(std::min(kChunk, size - pos));
        if (!chunk.ok()) return chunk.status();
      }
      // One byte past the end: a file that grew while read is not the file that was hashed.
      uint8_t extra;
      absl::StatusOr<size_t> more = file.Read(size, std::span<uint8_t>(&extra, 1));
      if (!more.ok()) return more.status();
      if (*more != 0) {
        return absl::DataLossError(absl::StrCat(label, ": grew past ", size, " bytes while being read"));
      }
    }
    absl::StatusOr<io::FileIdentity> after = file.Identity();
    if (!after.ok()) return after.status();
    if (!(*after == *id)) return io::ChangedWhileRead(label, *id, *after);
    if (defer) {
      f->stream_from = pos;  // StreamTrees hashes from offset 0 again, using the kept header
    } else {
      hashers.Finish(f);
    }
    if (whole) {
      f->content = std::make_shared<const std::vector<uint8_t>>(std::move(kept));
    } else if ((options_.keep == ReadOptions::Keep::kMetadata || defer) && !header.empty()) {
      f->content = std::make_shared<const std::vector<uint8_t>>(std::move(header));
    }
    if (f->safetensors != nullptr && f->content != nullptr) {
      f->safetensors = std::make_shared<const SafetensorsFile>(label, f->safetensors->header(),
                                                               f->content, size);
    }
    return pos;
  }

 private:
  const std::string& root_;
  const ReadOptions& options_;
  Progress& progress_;
};

}  // namespace

const ImageFile* TreeImage::Find(std::string_view name) const {
  const std::string n(name);
  auto it = std::lower_bound(files.begin(), files.end(), n, [](const ImageFile& f, const std::string& v) {
    return PosixPathLess(f.name, v);
  });
  return it != files.end() && it->name == n ? &*it : nullptr;
}

bool TreeImage::IsDirectory(std::string_view path) const {
  return std::binary_search(directories.begin(), directories.end(), std::string(path),
                            PosixPathLess);
}

absl::StatusOr<std::span<const uint8_t>> TreeImage::Content(std::string_view path) const {
  const ImageFile* f = Find(path);
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(root, "/", std::string(path), ": no such file"));
  if (!f->complete()) {
    return absl::FailedPreconditionError(
        absl::StrCat(root, "/", std::string(path), ": its bytes were not kept by this read"));
  }
  return std::span<const uint8_t>(*f->content);
}

absl::Status TreeImage::CheckUnchanged() const {
  if (absl::Status s = io::CheckLinksUnchanged(links); !s.ok()) return s;
  for (const ImageFile& f : files) {
    absl::StatusOr<io::FileIdentity> now = f.parent->StatAt(f.leaf);
    if (!now.ok()) {
      return absl::DataLossError(
          absl::StrCat(root, "/", f.path, ": disappeared after it was read"));
    }
    if (!(*now == f.identity)) {
      return absl::DataLossError(absl::StrCat(
          root, "/", f.path,
          ": changed after it was read (inode, size, mtime or ctime differ)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const TreeImage>> ReadTree(TreeListing listing,
                                                          const ReadOptions& options,
                                                          Progress& progress) {
  if (!HashesEverything(options) && options.keep == ReadOptions::Keep::kNothing) {
    return absl::InvalidArgumentError("read: nothing to compute");
  }
  auto image = std::make_shared<TreeImage>();
  image->root = listing.root_dir->label();
  image->root_dir = listing.root_dir;
  image->directories = std::move(listing.directories);
  image->links = std::move(listing.links);
  uint64_t total = 0, kept = 0;
  for (TreeFile& t : listing.files) {
    ImageFile f;
    f.path = std::move(t.path);
    f.name = std::move(t.name);
    f.parent = std::move(t.parent);
    f.leaf = std::move(t.leaf);
    f.target = std::move(t.target);
    f.wants_git_blob_id = t.git_blob_id;
    f.identity.size = t.size;
    total += HashesEverything(options) ? t.size : 0;
    kept += KeepsWhole(f, options) ? t.size : 0;
    image->files.push_back(std::move(f));
  }
  if (kept > options.memory_window) {
    return absl::ResourceExhaustedError(absl::StrCat(
        image->root, ": the audit keeps ", kept, " bytes in memory, over the memory window of ",
        options.memory_window, " bytes (raise it with --memory-window)"));
  }
  // Largest first, so that the last file to start is a small one.
  std::vector<size_t> order(image->files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return image->files[a].size() > image->files[b].size();
  });
  std::vector<uint64_t> read(order.size(), 0);
  progress.Begin("read", total);
  FileReader reader(image->root, options, progress);
  absl::Status st = ParallelFor(order.size(), options.threads, [&](size_t i) {
    absl::StatusOr<uint64_t> n = reader.Read(&image->files[order[i]]);
    if (!n.ok()) return n.status();
    read[i] = *n;
    return absl::OkStatus();
  });
  progress.End();
  if (!st.ok()) return st;
  for (uint64_t n : read) image->bytes_read += n;
  for (const ImageFile& f : image->files) image->kept_bytes += f.content ? f.content->size() : 0;
  return std::shared_ptr<const TreeImage>(std::move(image));
}

absl::StatusOr<std::shared_ptr<const TreeImage>> ReadTree(const std::string& root,
                                                          const ReadOptions& options,
                                                          const TreeWalkOptions& walk) {
  absl::StatusOr<TreeListing> listing = ListTree(root, walk);
  if (!listing.ok()) return listing.status();
  return ReadTree(*std::move(listing), options, NoProgress());
}

}  // namespace ckpt
