#include "core/io/tree_image.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>

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


// Whole files kept in memory under these options, counted against the window before the read.
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

// The memory window as the files read at once share it (docs/audit-engine.md, "Memory"): the
// whole files kept are counted before any read, and a safetensors header when its 8-byte length
// has been read, before a byte of it is allocated. A kept header stays counted; a header read
// only to be parsed (Keep::kNothing) is given back after the parse, and a header that does not
// fit waits for such headers of other threads when their return would make room.
class WindowBudget {
 public:
  WindowBudget(uint64_t window, uint64_t held) : window_(window), held_(held) {}

  // `n` bytes of `label`'s header (`what` says which form). RESOURCE_EXHAUSTED naming the
  // file, the size, what is already kept and the window.
  absl::Status Take(const std::string& label, const char* what, uint64_t n, bool kept) {
    std::unique_lock<std::mutex> lock(mu_);
    while (held_ + n > window_) {
      if (transient_ == 0 || held_ - transient_ + n > window_) {
        return absl::ResourceExhaustedError(absl::StrCat(
            label, ": its ", what, " of ", n, " bytes does not fit in the memory window of ",
            window_, " bytes beside the ", held_ - transient_,
            " bytes of small files and headers already kept (raise it with --memory-window)"));
      }
      returned_.wait(lock);
    }
    held_ += n;
    if (!kept) transient_ += n;
    return absl::OkStatus();
  }

  void GiveBack(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ -= n;
      transient_ -= n;
    }
    returned_.notify_all();
  }

 private:
  const uint64_t window_;
  std::mutex mu_;
  std::condition_variable returned_;
  uint64_t held_ = 0, transient_ = 0;
};

// About what a parsed header holds on the heap beyond its raw bytes: the entries with their
// names and shapes, the metadata, and the reader's index by name and lending slots
// (core/safetensors.h). Blocks are rounded up as the allocator does.
uint64_t ParsedBytes(const SafetensorsFile& f) {
  constexpr uint64_t kBlock = 16;  // allocator header per block
  constexpr uint64_t kNode = 32;   // a map node's links and colour
  auto heap = [&](const std::string& s) -> uint64_t {
    return s.capacity() > 15 ? s.capacity() + 1 + kBlock : 0;  // beyond the inline buffer
  };
  const SafetensorsHeader& h = f.header();
  uint64_t n = sizeof(SafetensorsFile) + h.tensors.capacity() * sizeof(TensorInfo) + kBlock;
  for (const TensorInfo& t : h.tensors) {
    n += heap(t.name) + t.shape.capacity() * sizeof(uint64_t) + kBlock;
    n += kNode + sizeof(std::string_view) + sizeof(void*) + kBlock + sizeof(void*);
  }
  for (const auto& [key, value] : h.metadata) {
    n += kNode + 2 * sizeof(std::string) + kBlock + heap(key) + heap(value);
  }
  return n;
}

class FileReader {
 public:
  FileReader(const std::string& root, const ReadOptions& o, WindowBudget& budget,
             Progress& progress)
      : root_(root), options_(o), budget_(budget), progress_(progress) {}

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
    const bool defer = Defers(*f, options_);
    // Bytes go straight into `kept` when the file is kept whole (counted before the read), into
    // `header` for a safetensors header (counted once its length is known), else through
    // `scratch`.
    std::shared_ptr<std::vector<uint8_t>> kept, header;
    std::vector<uint8_t> scratch;
    if (whole) kept = std::make_shared<std::vector<uint8_t>>(size);
    io_internal::FileHashers hashers(options_, size, f->wants_git_blob_id);
    uint64_t pos = 0;
    auto consume = [&](uint64_t n, std::span<uint8_t> into) -> absl::StatusOr<std::span<const uint8_t>> {
      if (progress_.Cancelled()) return absl::CancelledError(absl::StrCat(label, ": read cancelled"));
      std::span<uint8_t> dst = into;
      if (dst.empty() && whole) {
        dst = std::span<uint8_t>(*kept).subspan(pos, n);
      } else if (dst.empty()) {
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

    // A header read only to be parsed goes back to the window once parsed (or on an error).
    uint64_t transient = 0;
    struct GiveBack {
      WindowBudget& budget;
      uint64_t& n;
      void operator()() {
        if (n > 0) budget.GiveBack(n);
        n = 0;
      }
      ~GiveBack() { (*this)(); }
    } give_back{budget_, transient};
    std::span<const uint8_t> header_bytes;  // the 8-byte length and the header JSON
    if (IsSafetensors(f->path) && size >= 8) {
      absl::StatusOr<std::span<const uint8_t>> len = consume(8, {});
      if (!len.ok()) return len.status();
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | (*len)[i];
      // Past the limit or the file, the header is not read: the parse reports it.
      const uint64_t header_len =
          n <= options_.limits.max_header_bytes && n <= size - 8 ? 8 + n : 8;
      if (whole) {
        if (header_len > 8) {
          absl::StatusOr<std::span<const uint8_t>> json = consume(n, {});
          if (!json.ok()) return json.status();
        }
        header_bytes = std::span<const uint8_t>(*kept).first(header_len);
      } else {
        const bool keeps_header = options_.keep == ReadOptions::Keep::kMetadata || defer;
        if (absl::Status s = budget_.Take(label, "safetensors header", header_len, keeps_header);
            !s.ok()) {
          return s;
        }
        if (!keeps_header) transient = header_len;
        header = std::make_shared<std::vector<uint8_t>>(header_len);
        std::copy(len->begin(), len->end(), header->begin());
        if (header_len > 8) {
          absl::StatusOr<std::span<const uint8_t>> json =
              consume(n, std::span<uint8_t>(*header).subspan(8));
          if (!json.ok()) return json.status();
        }
        header_bytes = *header;
      }
    }
    if (IsSafetensors(f->path)) {
      absl::StatusOr<SafetensorsHeader> parsed =
          ParseSafetensorsHeader(header_bytes, size, label, options_.limits);
      if (transient > 0) {  // only parsed (Keep::kNothing)
        header.reset();
        give_back();  // before taking more: a thread never waits while holding a header
      }
      if (parsed.ok()) {
        std::shared_ptr<const std::vector<uint8_t>> content = whole ? kept : header;
        f->safetensors =
            std::make_shared<const SafetensorsFile>(label, *std::move(parsed), content, size);
        // The parsed entries live as long as the image: counted too, once their size is known.
        f->parsed_bytes = ParsedBytes(*f->safetensors);
        if (absl::Status s = budget_.Take(label, "parsed safetensors header", f->parsed_bytes,
                                          /*kept=*/true);
            !s.ok()) {
          return s;
        }
        if (options_.tensor_digests) hashers.SetTensors(f->safetensors.get(), &f->tensor_digests);
      } else {
        f->header_status = parsed.status();  // hashed as plain bytes; the checks report it
      }
    }
    if ((HashesEverything(options_) || whole) && !defer) {
      while (pos < size) {
        absl::StatusOr<std::span<const uint8_t>> chunk = consume(std::min(kChunk, size - pos), {});
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
      f->content = std::move(kept);
    } else if (header != nullptr) {
      f->content = std::move(header);
    }
    return pos;
  }

 private:
  const std::string& root_;
  const ReadOptions& options_;
  WindowBudget& budget_;
  Progress& progress_;
};

}  // namespace

std::string TreeImage::RootPath() const {
  return single_file.empty() ? root : absl::StrCat(root, "/", single_file);
}

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
  image->single_file = std::move(listing.single_file);
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
  if (kept > options.memory_window || options.window_in_use > options.memory_window - kept) {
    return absl::ResourceExhaustedError(absl::StrCat(
        image->root, ": the audit keeps ", kept, " bytes of small files in memory",
        options.window_in_use > 0 ? absl::StrCat(" beside ", options.window_in_use,
                                                 " bytes kept for the other tree")
                                  : "",
        ", over the memory window of ", options.memory_window,
        " bytes (raise it with --memory-window)"));
  }
  WindowBudget budget(options.memory_window, options.window_in_use + kept);
  // Largest first, so that the last file to start is a small one.
  std::vector<size_t> order(image->files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return image->files[a].size() > image->files[b].size();
  });
  std::vector<uint64_t> read(order.size(), 0);
  progress.Begin("read", total);
  FileReader reader(image->root, options, budget, progress);
  absl::Status st = ParallelFor(order.size(), options.threads, [&](size_t i) {
    absl::StatusOr<uint64_t> n = reader.Read(&image->files[order[i]]);
    if (!n.ok()) return n.status();
    read[i] = *n;
    return absl::OkStatus();
  });
  progress.End();
  if (!st.ok()) return st;
  for (uint64_t n : read) image->bytes_read += n;
  for (const ImageFile& f : image->files) {
    image->kept_bytes += (f.content ? f.content->size() : 0) + f.parsed_bytes;
  }
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
