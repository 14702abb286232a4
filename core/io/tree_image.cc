#include "core/io/tree_image.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/parallel.h"

namespace ckpt {
namespace {

constexpr uint64_t kChunk = 8ull << 20;

bool IsSafetensors(const std::string& path) { return absl::EndsWith(path, ".safetensors"); }

// Every digest taken of one file, fed its bytes in order.
class FileHashers {
 public:
  FileHashers(const ReadOptions& o, uint64_t size, bool git_blob_id)
      : options_(o), size_(size) {
    if (git_blob_id) git_.emplace(size);
  }

  // Tensors are known once the header is read; they tile [data_start, size).
  void SetTensors(const SafetensorsFile* f, std::vector<Digest>* out) {
    tensors_ = f;
    tensor_out_ = out;
    out->assign(f->tensors().size(), Digest{});
  }

  void Update(uint64_t offset, std::span<const uint8_t> bytes) {
    if (options_.file_digests) whole_.Update(bytes);
    if (git_) git_->Update(bytes);
    hashed_ += bytes.size();
    if (options_.range_size > 0) UpdateRanges(offset, bytes);
    if (tensors_ != nullptr) UpdateTensors(offset, bytes);
  }

  void Finish(ImageFile* f) {
    if (options_.file_digests) f->sha256 = whole_.Finish();
    if (git_ && hashed_ == size_) f->git_blob_id = git_->Finish();
    // Tensors still open here are empty ones at the end of the buffer.
    while (tensors_ != nullptr && next_ < tensors_->tensors().size()) {
      (*tensor_out_)[next_++] = tensor_.Finish();
    }
    if (options_.range_size > 0 && (range_pos_ > 0 || size_ == 0)) {
      range_digests_.push_back(range_.Finish());
    }
    f->range_digests = std::move(range_digests_);
  }

 private:
  void UpdateRanges(uint64_t offset, std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      uint64_t n = std::min<uint64_t>(bytes.size(), options_.range_size - range_pos_);
      range_.Update(bytes.first(n));
      bytes = bytes.subspan(n);
      range_pos_ += n;
      if (range_pos_ == options_.range_size) {
        range_digests_.push_back(range_.Finish());
        range_pos_ = 0;
      }
    }
  }

  void UpdateTensors(uint64_t offset, std::span<const uint8_t> bytes) {
    const std::vector<TensorInfo>& ts = tensors_->tensors();
    const uint64_t ds = tensors_->data_start();
    uint64_t pos = offset;
    while (!bytes.empty() && next_ < ts.size()) {
      const uint64_t begin = ds + ts[next_].begin, end = ds + ts[next_].end;
      if (pos < begin) {  // header bytes
        uint64_t skip = std::min<uint64_t>(bytes.size(), begin - pos);
        bytes = bytes.subspan(skip);
        pos += skip;
        continue;
      }
      uint64_t n = std::min<uint64_t>(bytes.size(), end - pos);
      tensor_.Update(bytes.first(n));
      bytes = bytes.subspan(n);
      pos += n;
      if (pos == end) {
        (*tensor_out_)[next_++] = tensor_.Finish();
        // Empty tensors that follow have the digest of no bytes.
        while (next_ < ts.size() && ts[next_].begin == ts[next_].end) {
          (*tensor_out_)[next_++] = tensor_.Finish();
        }
      }
    }
  }

  const ReadOptions& options_;
  const uint64_t size_;
  Sha256 whole_, range_, tensor_;
  std::optional<GitBlobHasher> git_;  // only for files whose hub name or etag is a git blob id
  uint64_t hashed_ = 0;
  uint64_t range_pos_ = 0;
  std::vector<Digest> range_digests_;
  const SafetensorsFile* tensors_ = nullptr;
  std::vector<Digest>* tensor_out_ = nullptr;
  size_t next_ = 0;
};

// Whole files kept in memory under these options (safetensors headers under kMetadata are
// kept too, but are bounded by the header limit and not counted against the window).
bool KeepsWhole(const ImageFile& f, const ReadOptions& o) {
  switch (o.keep) {
    case ReadOptions::Keep::kNothing: return false;
    case ReadOptions::Keep::kEverything: return true;
    case ReadOptions::Keep::kMetadata: return !IsSafetensors(f.path) && f.size() <= o.max_small_file;
  }
  return false;
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
    FileHashers hashers(options_, size, f->wants_git_blob_id);
    uint64_t pos = 0;
    auto consume = [&](uint64_t n) -> absl::StatusOr<std::span<const uint8_t>> {
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
    if (HashesEverything(options_) || whole) {
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
    if (!(*after == *id)) {
      return absl::DataLossError(absl::StrCat(
          label, ": changed while being read (size, mtime or ctime moved after ", pos,
          " bytes)"));
    }
    hashers.Finish(f);
    if (whole) {
      f->content = std::make_shared<const std::vector<uint8_t>>(std::move(kept));
    } else if (options_.keep == ReadOptions::Keep::kMetadata && !header.empty()) {
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
