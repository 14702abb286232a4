#include "core/oci/artifact.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/oci/tar_layer.h"
#include "core/text/name_encoding.h"

namespace ckpt::oci {
namespace {

constexpr uint64_t kDevice = 0x6f6369;  // "oci": no file system's device number
constexpr uint64_t kFirstReadAhead = 256u << 10;
constexpr uint64_t kMaxReadAhead = 16u << 20;
constexpr size_t kMaxAheadRanges = 4096;  // more: reads ahead are no longer remembered

enum class LayerKind { kRaw, kTar };

struct LayerType {
  LayerKind kind;
  Compression compression = Compression::kNone;
};

// The layer media types ckpt-audit reads (docs/interop.md, "OCI registries").
std::optional<LayerType> LayerTypeOf(absl::string_view media_type) {
  absl::string_view t = media_type;
  if (absl::ConsumePrefix(&t, "application/vnd.cncf.model.")) {
    bool known = false;
    for (absl::string_view kind : {"weight.v1.", "weight.config.v1.", "doc.v1.", "code.v1.",
                                  "dataset.v1."}) {
      known = known || absl::ConsumePrefix(&t, kind);
    }
    if (!known) return std::nullopt;
    if (t == "raw") return LayerType{LayerKind::kRaw};
  } else if (!absl::ConsumePrefix(&t, "application/vnd.oci.image.layer.v1.")) {
    if (media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip") {
      return LayerType{LayerKind::kTar, Compression::kGzip};
    }
    return std::nullopt;
  }
  if (t == "tar") return LayerType{LayerKind::kTar, Compression::kNone};
  if (t == "tar+gzip") return LayerType{LayerKind::kTar, Compression::kGzip};
  if (t == "tar+zstd") return LayerType{LayerKind::kTar, Compression::kZstd};
  return std::nullopt;
}

struct RawLayer {
  Descriptor descriptor;
};
using Content = std::variant<RawLayer, std::shared_ptr<const std::vector<uint8_t>>>;

struct Node {
  Content content;
  io::FileIdentity identity;
};

// Bytes of raw layers fetched ahead of the engine's reads, shared by every open file of one
// artifact so that they stay bounded however many files the engine has open at once.
class ReadAheadPool {
 public:
  explicit ReadAheadPool(uint64_t bytes) : left_(bytes) {}
  // Up to `want` bytes: fewer, or none, when less is left.
  uint64_t Take(uint64_t want) {
    uint64_t left = left_.load();
    uint64_t got = 0;
    do {
      got = std::min(want, left);
    } while (!left_.compare_exchange_weak(left, left - got));
    return got;
  }
  void Give(uint64_t bytes) { left_ += bytes; }

 private:
  std::atomic<uint64_t> left_;
};

// Everything the directories of one artifact share.
struct Tree {
  std::string label;  // oci://REGISTRY/REPO@DIGEST
  std::shared_ptr<const Registry> registry;
  std::shared_ptr<ReadAheadPool> read_ahead;
  std::map<std::string, Node> files;                  // full path -> file
  std::map<std::string, io::FileIdentity> directories;  // full path ("" the root) -> identity
};

// A raw layer read by position (docs/interop.md, "Fewer requests"). The engine's cursor reads
// each file front to back from the end of its header, jumping only over ranges it read ahead
// earlier; a read that continues the cursor and that the buffer does not hold refills the buffer
// with one Range request from there, for a span that starts at kFirstReadAhead and doubles with
// each refill up to kMaxReadAhead (as far as the artifact's pool allows). Any other read outside
// the buffer (ahead of the cursor, or behind it) is a request of exactly its own range and
// leaves the buffer as it is. Every byte served was in a Range answer whose status,
// Content-Range and length ReadBlobRange checked, so the engine hashes the layer's bytes
// whichever request brought them.
class RawFile : public io::RandomAccessFile {
 public:
  RawFile(std::shared_ptr<const Tree> tree, std::string path, Descriptor d, io::FileIdentity id)
      : tree_(std::move(tree)), path_(std::move(path)), d_(std::move(d)), id_(id) {}
  ~RawFile() override { tree_->read_ahead->Give(held_); }

  absl::StatusOr<size_t> Read(uint64_t offset, std::span<uint8_t> out) const override {
    if (offset >= d_.size) return 0;
    out = out.first(static_cast<size_t>(std::min<uint64_t>(out.size(), d_.size - offset)));
    std::unique_lock<std::mutex> lock(mu_);
    const bool cursor = Continues(offset);
    if (offset >= begin_ && offset < begin_ + length_) {
      const size_t head =
          static_cast<size_t>(std::min<uint64_t>(out.size(), begin_ + length_ - offset));
      std::memcpy(out.data(), buffer_.get() + (offset - begin_), head);
      Served(offset, head, cursor);
      if (head == out.size()) return head;
      lock.unlock();  // the rest starts where the buffer ends
      absl::StatusOr<size_t> rest = Read(offset + head, out.subspan(head));
      if (!rest.ok()) return rest.status();
      return head + *rest;
    }
    uint64_t span = 0;
    if (cursor && out.size() < kMaxReadAhead) {
      const uint64_t want = std::min(window_, d_.size - offset);
      window_ = std::min(window_ * 2, kMaxReadAhead);
      if (want > held_) {
        const uint64_t more = tree_->read_ahead->Take(want - held_);
        if (more > 0) {
          buffer_.reset();  // never two buffers at once
          length_ = 0;
          held_ += more;
          buffer_.reset(new uint8_t[held_]);
        }
      }
      span = std::min(held_, d_.size - offset);
    }
    if (span <= out.size()) {  // a request of its own, as asked
      lock.unlock();
      if (absl::Status s = Fetch(offset, out); !s.ok()) return s;
      lock.lock();
      Served(offset, out.size(), cursor);
      return out.size();
    }
    length_ = 0;
    if (absl::Status s = Fetch(offset, {buffer_.get(), static_cast<size_t>(span)}); !s.ok()) {
      return s;
    }
    begin_ = offset;
    length_ = span;
    std::memcpy(out.data(), buffer_.get(), out.size());
    Served(offset, out.size(), cursor);
    return out.size();
  }
  absl::StatusOr<io::FileIdentity> Identity() const override { return id_; }
  void Consumed(uint64_t, uint64_t) const override {}

 private:
  // Whether a read at `offset` continues the cursor: the file's first read (the cursor starts
  // after the header the engine has already read), one that starts where the cursor ended, or
  // past it over ranges read ahead of it.
  bool Continues(uint64_t offset) const {
    if (!started_) return true;
    uint64_t at = next_;
    while (at < offset) {
      auto it = ahead_.upper_bound(at);
      if (it == ahead_.begin() || std::prev(it)->second <= at) return false;
      at = std::prev(it)->second;
    }
    return offset >= next_;
  }
  void Served(uint64_t offset, uint64_t n, bool cursor) const {
    if (cursor) {
      started_ = true;
      next_ = offset + n;
      std::erase_if(ahead_, [&](const auto& r) { return r.second <= next_; });
    } else if (offset + n > next_ && ahead_.size() < kMaxAheadRanges) {
      uint64_t& end = ahead_[offset];
      end = std::max(end, offset + n);
    }
  }
  absl::Status Fetch(uint64_t offset, std::span<uint8_t> out) const {
    absl::Status s = tree_->registry->ReadBlobRange(d_.digest, d_.size, offset, out);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(tree_->label, "/", EncodeName(path_), " at ",
                                               offset, ": ", s.message()));
  }

  std::shared_ptr<const Tree> tree_;
  std::string path_;
  Descriptor d_;
  io::FileIdentity id_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<uint8_t[]> buffer_;  // held_ bytes, taken from the pool
  mutable uint64_t held_ = 0;
  mutable uint64_t begin_ = 0, length_ = 0;  // the layer's [begin_, begin_ + length_) in buffer_
  mutable bool started_ = false;
  mutable uint64_t next_ = 0;  // where the cursor's last read ended
  mutable std::map<uint64_t, uint64_t> ahead_;  // ranges read ahead of it: begin -> end
  mutable uint64_t window_ = kFirstReadAhead;
};

class MemoryFile : public io::RandomAccessFile {
 public:
  MemoryFile(std::shared_ptr<const std::vector<uint8_t>> bytes, io::FileIdentity id)
      : bytes_(std::move(bytes)), id_(id) {}
  absl::StatusOr<size_t> Read(uint64_t offset, std::span<uint8_t> out) const override {
    if (offset >= bytes_->size()) return 0;
    size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), bytes_->size() - offset));
    std::memcpy(out.data(), bytes_->data() + offset, n);
    return n;
  }
  absl::StatusOr<io::FileIdentity> Identity() const override { return id_; }
  void Consumed(uint64_t, uint64_t) const override {}

 private:
  std::shared_ptr<const std::vector<uint8_t>> bytes_;
  io::FileIdentity id_;
};

class ArtifactDirectory : public io::Directory {
 public:
  ArtifactDirectory(std::shared_ptr<const Tree> tree, std::string prefix)
      : tree_(std::move(tree)),
        prefix_(std::move(prefix)),
        label_(prefix_.empty() ? tree_->label : absl::StrCat(tree_->label, "/", prefix_)) {}

  absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> OpenFile(
      const std::string& name) const override {
    auto it = tree_->files.find(Full(name));
    if (it == tree_->files.end()) return NotFound(name);
    const Node& n = it->second;
    if (const RawLayer* raw = std::get_if<RawLayer>(&n.content)) {
      return std::make_unique<RawFile>(tree_, it->first, raw->descriptor, n.identity);
    }
    return std::make_unique<MemoryFile>(
        std::get<std::shared_ptr<const std::vector<uint8_t>>>(n.content), n.identity);
  }
  absl::StatusOr<std::unique_ptr<io::Directory>> OpenDirectory(
      const std::string& name) const override {
    if (!tree_->directories.contains(Full(name))) return NotFound(name);
    return std::make_unique<ArtifactDirectory>(tree_, Full(name));
  }
  absl::StatusOr<std::vector<io::DirEntry>> List() const override {
    std::vector<io::DirEntry> out;
    auto children = [&](const auto& map, io::EntryType type) {
      for (const auto& [path, unused] : map) {
        absl::string_view p = path;
        if (p.empty() || !absl::ConsumePrefix(&p, prefix_.empty() ? "" : prefix_ + "/")) continue;
        if (p.find('/') == absl::string_view::npos) out.push_back({std::string(p), type});
      }
    };
    children(tree_->files, io::EntryType::kRegular);
    children(tree_->directories, io::EntryType::kDirectory);
    return out;
  }
  absl::StatusOr<io::FileIdentity> StatAt(const std::string& name) const override {
    if (auto f = tree_->files.find(Full(name)); f != tree_->files.end()) return f->second.identity;
    if (auto d = tree_->directories.find(Full(name)); d != tree_->directories.end()) {
      return d->second;
    }
    return NotFound(name);
  }
  absl::StatusOr<io::FileIdentity> Identity() const override {
    return tree_->directories.at(prefix_);
  }
  absl::StatusOr<std::string> ReadLink(const std::string& name) const override {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, "/", EncodeName(name), ": an OCI artifact holds no links"));
  }
  absl::StatusOr<std::unique_ptr<io::Directory>> OpenParent() const override {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": an OCI artifact's directories have no parent outside it"));
  }
  const std::string& label() const override { return label_; }

 private:
  std::string Full(const std::string& name) const {
    return prefix_.empty() ? name : absl::StrCat(prefix_, "/", name);
  }
  absl::Status NotFound(const std::string& name) const {
    return absl::NotFoundError(absl::StrCat(label_, "/", EncodeName(name), ": not in the artifact"));
  }
  std::shared_ptr<const Tree> tree_;
  std::string prefix_;
  std::string label_;
};

// Adds `path` (and its parent directories) to `tree`; INVALID_ARGUMENT for a name taken twice.
absl::Status AddFile(Tree& tree, const std::string& path, Content content, uint64_t size,
                     const std::string& layer) {
  if (tree.files.contains(path) || tree.directories.contains(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        layer, ": '", EncodeName(path), "' is already a file or directory of the artifact "
        "(duplicate names are refused)"));
  }
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    std::string dir = path.substr(0, slash);
    if (tree.files.contains(dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          layer, ": '", EncodeName(dir), "' is both a file and a directory of the artifact"));
    }
    tree.directories.try_emplace(dir, io::FileIdentity{kDevice, 0, 0, 0, 0});
  }
  io::FileIdentity id{kDevice, tree.files.size() + 1, size, 0, 0};
  tree.files.emplace(path, Node{std::move(content), id});
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Artifact>> Artifact::Open(const std::string& text,
                                                               const ArtifactOptions& options) {
  auto ref = ParseReference(text);
  if (!ref.ok()) return ref.status();
  auto registry = Registry::Connect(*ref, options.client);
  if (!registry.ok()) return registry.status();
  auto fetched = (*registry)->GetManifest(ref->digest.empty() ? ref->tag : ref->digest);
  if (!fetched.ok()) return fetched.status();
  auto artifact = std::shared_ptr<Artifact>(new Artifact());
  artifact->ref_ = ref->ByDigest(fetched->digest);
  const std::string label = artifact->ref_.ToString();
  auto manifest = ParseManifest(fetched->bytes, fetched->media_type, label);
  if (!manifest.ok()) return manifest.status();
  artifact->manifest_ = *std::move(manifest);

  auto tree = std::make_shared<Tree>();
  tree->label = label;
  tree->registry = *registry;
  tree->read_ahead = std::make_shared<ReadAheadPool>(options.read_ahead_budget);
  tree->directories[""] = io::FileIdentity{kDevice, 0, 0, 0, 0};
  uint64_t budget = options.tar_budget;
  const auto& layers = artifact->manifest_.layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Descriptor& d = layers[i];
    const std::string layer = absl::StrCat(label, ": layer ", i, " (", d.digest, ")");
    std::optional<LayerType> type = LayerTypeOf(d.media_type);
    if (!type) {
      return absl::InvalidArgumentError(absl::StrCat(
          layer, ": media type '", d.media_type, "' is not a model file layer this build reads"));
    }
    if (type->kind == LayerKind::kRaw) {
      auto name = d.annotations.find(kModelFilepathAnnotation);
      if (name == d.annotations.end()) name = d.annotations.find(kTitleAnnotation);
      if (name == d.annotations.end()) {
        return absl::InvalidArgumentError(absl::StrCat(layer, ": a raw layer without an ",
                                                       kModelFilepathAnnotation, " or ",
                                                       kTitleAnnotation, " annotation"));
      }
      auto path = CleanLayerPath(name->second, layer);
      if (!path.ok()) return path.status();
      if (absl::Status s = AddFile(*tree, *path, RawLayer{d}, d.size, layer); !s.ok()) return s;
      artifact->raw_files_[EncodeName(*path)] = d.digest.substr(7);
      continue;
    }
    // Read front to back once; nothing of it is served before its length and digest check.
    TarLayer tar(layer, type->compression, &budget);
    absl::Status s = (*registry)->ReadBlob(
        d.digest, d.size, [&](std::span<const uint8_t> bytes) { return tar.Feed(bytes); });
    if (!s.ok()) return s;
    auto entries = tar.Finish();
    if (!entries.ok()) return entries.status();
    for (TarEntry& e : *entries) {
      uint64_t size = e.bytes->size();
      if (absl::Status a = AddFile(*tree, e.path, std::move(e.bytes), size, layer); !a.ok()) {
        return a;
      }
    }
  }
  artifact->root_ = std::make_shared<ArtifactDirectory>(tree, "");
  return std::shared_ptr<const Artifact>(std::move(artifact));
}

}  // namespace ckpt::oci
