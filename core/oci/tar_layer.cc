#include "core/oci/tar_layer.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ckpt::oci {
namespace {

constexpr size_t kBlock = 512;
constexpr uint64_t kMaxExtendedHeader = 64u << 10;  // pax and GNU long-name records
constexpr uint64_t kMaxEntries = 1u << 20;
constexpr uint64_t kMaxTrailer = 1u << 20;  // zero bytes after the archive's end
constexpr size_t kOutChunk = 64u << 10;
// Bytes counted for each kept file beside its contents and name: its TarEntry, the vector's
// control block and the artifact's map node (docs/interop.md, "What is read, and how").
constexpr uint64_t kEntryCost = 256;

uint64_t ParseOctal(const uint8_t* p, size_t n, bool* ok) {
  uint64_t v = 0;
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) {
      *ok = false;
      return 0;
    }
    v = v * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != 0) *ok = false;
  }
  if (!any) *ok = false;
  return v;
}

// What a stream's first bytes are: a gzip member (RFC 1952: 1f 8b), a zstd frame (RFC 8878:
// 28 b5 2f fd), or neither. `head` holds up to 4 bytes.
Compression Sniff(const std::string& head) {
  if (absl::StartsWith(head, "\x1f\x8b")) return Compression::kGzip;
  if (absl::StartsWith(head, "\x28\xb5\x2f\xfd")) return Compression::kZstd;
  return Compression::kNone;
}

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kGzip: return "gzip";
    case Compression::kZstd: return "zstd";
    case Compression::kNone: break;
  }
  return "an uncompressed tar";
}

std::string Field(const uint8_t* p, size_t n) {
  size_t len = 0;
  while (len < n && p[len] != 0) ++len;
  return std::string(reinterpret_cast<const char*>(p), len);
}

}  // namespace

absl::StatusOr<std::string> CleanLayerPath(absl::string_view path, const std::string& label) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": path '", path, "' ", why));
  };
  if (absl::StartsWith(path, "/")) return bad("is absolute");
  absl::string_view p = path;
  while (absl::ConsumePrefix(&p, "./")) {
  }
  while (absl::ConsumeSuffix(&p, "/")) {
  }
  if (p.empty() || p == ".") return bad("names no file");
  std::vector<std::string> parts;
  for (absl::string_view c : absl::StrSplit(p, '/')) {
    if (c == "..") return bad("has a '..' component");
    if (c.empty() || c == ".") return bad("has an empty or '.' component");
    if (absl::StartsWith(c, ".wh.")) return bad("is an OCI whiteout");
    if (c.find('\0') != absl::string_view::npos) return bad("holds a NUL byte");
    parts.emplace_back(c);
  }
  return absl::StrJoin(parts, "/");
}

struct TarLayer::Impl {
  std::string label;
  Compression compression;
  uint64_t* budget;

  // The stream's first bytes, held until there are 4 (or the stream ends) and checked against
  // the media type's compression before anything is decompressed.
  std::string head;
  bool head_checked = false;

  z_stream z{};
  bool z_open = false;
  ZSTD_DCtx* zstd = nullptr;
  bool stream_ended = false;  // the compressed stream reached its end

  // The tar parser.
  enum class State { kHeader, kExtended, kData, kSkip, kEnd } state = State::kHeader;
  std::vector<uint8_t> block;  // a header being assembled
  uint64_t remaining = 0;      // bytes of the current entry's data
  uint64_t padding = 0;        // zero padding after it
  char extended_type = 0;
  std::string extended;  // a pax or GNU long-name record being assembled
  std::optional<std::string> next_path;  // from a pax `path` or GNU 'L' record
  std::optional<uint64_t> next_size;     // from a pax `size`
  bool pax_pending = false;   // a pax 'x' header names the next entry's properties
  bool long_pending = false;  // a GNU 'L' header names the next entry
  std::shared_ptr<std::vector<uint8_t>> file;
  std::string file_path;
  uint64_t zero_blocks = 0, trailer = 0, entries = 0;
  std::vector<TarEntry> out;

  absl::Status Bad(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", why));
  }

  absl::Status Header() {
    const uint8_t* h = block.data();
    if (std::all_of(block.begin(), block.end(), [](uint8_t b) { return b == 0; })) {
      if (++zero_blocks == 2) state = State::kEnd;
      return absl::OkStatus();
    }
    if (zero_blocks != 0) return Bad("a tar header after a zero block");
    if (++entries > kMaxEntries) return Bad(absl::StrCat("more than ", kMaxEntries, " entries"));
    bool ok = true;
    uint64_t sum = ParseOctal(h + 148, 8, &ok);
    uint64_t seen = 0;
    for (size_t i = 0; i < kBlock; ++i) seen += (i >= 148 && i < 156) ? ' ' : h[i];
    if (!ok || sum != seen) return Bad(absl::StrCat("tar header ", entries, ": bad checksum"));
    if (h[124] & 0x80) return Bad("a base-256 entry size (over 8 GiB) in a tar layer");
    uint64_t size = ParseOctal(h + 124, 12, &ok);
    if (!ok) return Bad(absl::StrCat("tar header ", entries, ": size is not octal"));
    std::string name = Field(h, 100);
    // Only a POSIX ustar header keeps a name prefix at 345; old-GNU headers keep atime and
    // ctime there, star ones times after a 131-byte prefix, and extractors disagree on what
    // such bytes name (docs/interop.md, "Tar headers").
    if (std::memcmp(h + 257, "ustar\0" "00", 8) == 0) {
      std::string prefix = Field(h + 345, 155);
      if (!std::all_of(h + 345 + prefix.size(), h + 500, [](uint8_t b) { return b == 0; })) {
        return Bad(absl::StrCat("tar header ", entries,
                                ": bytes after the name prefix's end (extractors disagree on the "
                                "name of such an entry)"));
      }
      if (!prefix.empty()) name = absl::StrCat(prefix, "/", name);
    } else if (h[345] != 0) {
      return Bad(absl::StrCat("tar header ", entries,
                              ": a header that is not POSIX ustar holds bytes where ustar keeps a "
                              "name prefix (extractors disagree on the name of such an entry)"));
    }
    const char type = static_cast<char>(h[156]);
    if (type == 'x' || type == 'g' || type == 'L') {
      if (size > kMaxExtendedHeader) {
        return Bad(absl::StrCat("an extended header of ", size, " bytes (at most ",
                                kMaxExtendedHeader, ")"));
      }
      // One pax header and one GNU long name at most per entry, never both naming it: the
      // extractors take different ones as the name.
      if ((type == 'x' && pax_pending) || (type == 'L' && long_pending)) {
        return Bad(absl::StrCat("tar header ", entries, ": a second ",
                                type == 'x' ? "pax header" : "GNU long name", " for one entry"));
      }
      if (type == 'x') pax_pending = true;
      if (type == 'L') {
        if (next_path) return BothNames();
        long_pending = true;
      }
      extended_type = type;
      extended.clear();
      remaining = size;
      padding = (kBlock - size % kBlock) % kBlock;
      state = State::kExtended;
      return remaining == 0 ? EndExtended() : absl::OkStatus();
    }
    if (next_path) name = *std::exchange(next_path, std::nullopt);
    if (next_size) size = *std::exchange(next_size, std::nullopt);
    pax_pending = long_pending = false;
    const std::string entry = absl::StrCat(label, ": entry '", name, "'");
    if (type == '1' || type == '2') {
      return absl::InvalidArgumentError(absl::StrCat(
          entry, " is a ", type == '1' ? "hard" : "symbolic", " link; links are refused"));
    }
    if (type == '5') {
      if (size != 0) return Bad(absl::StrCat("directory '", name, "' has data"));
      if (auto p = CleanLayerPath(name, label); !p.ok() && name != "./" && name != ".") {
        return p.status();
      }
      return absl::OkStatus();
    }
    if (type != '0' && type != '\0' && type != '7') {
      return absl::InvalidArgumentError(
          absl::StrCat(entry, " has type '", std::string(1, type),
                       "'; only regular files and directories are accepted"));
    }
    if (absl::EndsWith(name, "/")) {  // an extractor makes a directory of it, or fails
      return absl::InvalidArgumentError(
          absl::StrCat(entry, " is a regular file named with a trailing '/'"));
    }
    auto path = CleanLayerPath(name, label);
    if (!path.ok()) return path.status();
    // Its name and bookkeeping are kept too: an archive of a million empty files with 64 KiB
    // names must not hold 64 GiB beside a budget it never touched.
    const uint64_t cost = size + path->size() + kEntryCost;
    if (size > *budget || cost > *budget) {  // size first: a pax size near 2^64 wraps `cost`
      return absl::ResourceExhaustedError(absl::StrCat(
          entry, ": ", cost, " bytes (", size, " of contents, its name and ", kEntryCost,
          " of bookkeeping) do not fit the ", *budget,
          " bytes left of the memory window for tar layers' files; raise --memory-window, or "
          "push the weights as raw layers (read by position, never held whole)"));
    }
    *budget -= cost;
    file = std::make_shared<std::vector<uint8_t>>();
    file->reserve(size);
    file_path = *std::move(path);
    remaining = size;
    padding = (kBlock - size % kBlock) % kBlock;
    state = State::kData;
    if (remaining == 0) EndFile();
    return absl::OkStatus();
  }

  void EndFile() {
    out.push_back({file_path, std::move(file)});
    file.reset();
    state = padding ? State::kSkip : State::kHeader;
  }

  absl::Status BothNames() const {
    return Bad(absl::StrCat("tar header ", entries,
                            ": an entry named by both a pax path and a GNU long name"));
  }

  absl::Status EndExtended() {
    state = padding ? State::kSkip : State::kHeader;
    if (extended_type == 'L') {
      next_path = Field(reinterpret_cast<const uint8_t*>(extended.data()), extended.size());
      return absl::OkStatus();
    }
    const bool global = extended_type == 'g';
    // pax records: "LEN key=value\n". A key that names, sizes or links an entry is refused in
    // a global header (GNU tar applies it to every later entry) and in a GNU sparse form (its
    // real name and map live in other records); one key appears once per header.
    std::vector<absl::string_view> keys;
    absl::string_view rest = extended;
    while (!rest.empty()) {
      size_t sp = rest.find(' ');
      uint64_t len = 0;
      if (sp == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, sp), &len) ||
          len <= sp + 1 || len > rest.size() || rest[len - 1] != '\n') {
        return Bad("a malformed pax record");
      }
      absl::string_view rec = rest.substr(sp + 1, len - sp - 2);
      rest.remove_prefix(len);
      size_t eq = rec.find('=');
      if (eq == absl::string_view::npos) return Bad("a pax record without '='");
      absl::string_view key = rec.substr(0, eq), value = rec.substr(eq + 1);
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        return Bad(absl::StrCat("a pax header with two '", key, "' records"));
      }
      keys.push_back(key);
      if (absl::StartsWith(key, "GNU.sparse.")) {
        return Bad(absl::StrCat("a pax '", key, "' record (GNU sparse files are refused)"));
      }
      if (global && (key == "path" || key == "linkpath" || key == "size")) {
        return Bad(absl::StrCat("a global pax header with a '", key,
                                "' record (it would apply to every later entry)"));
      }
      if (global) continue;
      if (key == "path") {
        if (long_pending) return BothNames();
        next_path = std::string(value);
      }
      if (key == "linkpath") return Bad("a pax linkpath record (links are refused)");
      if (key == "size") {
        uint64_t s = 0;
        if (!absl::SimpleAtoi(value, &s)) return Bad("a pax size that is not a number");
        next_size = s;
      }
    }
    return absl::OkStatus();
  }

  // Decompressed archive bytes.
  absl::Status Parse(std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      switch (state) {
        case State::kEnd:
          for (uint8_t b : bytes) {
            if (b != 0) return Bad("data after the archive's end");
          }
          trailer += bytes.size();
          if (trailer > kMaxTrailer) return Bad("more than 1 MiB after the archive's end");
          return absl::OkStatus();
        case State::kHeader: {
          size_t take = std::min(bytes.size(), kBlock - block.size());
          block.insert(block.end(), bytes.begin(), bytes.begin() + take);
          bytes = bytes.subspan(take);
          if (block.size() == kBlock) {
            absl::Status s = Header();
            block.clear();
            if (!s.ok()) return s;
          }
          break;
        }
        case State::kExtended:
        case State::kData: {
          size_t take = static_cast<size_t>(std::min<uint64_t>(bytes.size(), remaining));
          if (state == State::kData) {
            file->insert(file->end(), bytes.begin(), bytes.begin() + take);
          } else {
            extended.append(reinterpret_cast<const char*>(bytes.data()), take);
          }
          bytes = bytes.subspan(take);
          remaining -= take;
          if (remaining == 0) {
            if (state == State::kData) {
              EndFile();
            } else if (absl::Status s = EndExtended(); !s.ok()) {
              return s;
            }
          }
          break;
        }
        case State::kSkip: {
          size_t take = static_cast<size_t>(std::min<uint64_t>(bytes.size(), padding));
          bytes = bytes.subspan(take);
          padding -= take;
          if (padding == 0) state = State::kHeader;
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  // A layer whose bytes are not what its media type says is refused, naming both: read as
  // declared it would be a decompressor's or the tar parser's error at best.
  absl::Status CheckHead() {
    head_checked = true;
    const Compression seen = Sniff(head);
    if (seen == compression || head.size() < 4) return absl::OkStatus();
    std::string hex;
    for (unsigned char c : head) {
      absl::StrAppend(&hex, hex.empty() ? "" : " ", absl::Hex(c, absl::kZeroPad2));
    }
    return Bad(absl::StrCat("the media type says ", CompressionName(compression),
                            ", but the layer starts with ", hex, " (",
                            seen == Compression::kNone ? "neither gzip nor zstd"
                                                       : CompressionName(seen),
                            ")"));
  }

  // Compressed (or plain) layer bytes: the first 4 are held for CheckHead.
  absl::Status Take(std::span<const uint8_t> in) {
    if (!head_checked) {
      const size_t take = std::min<size_t>(4 - head.size(), in.size());
      head.append(reinterpret_cast<const char*>(in.data()), take);
      in = in.subspan(take);
      if (head.size() < 4) return absl::OkStatus();
      if (absl::Status s = TakeHead(); !s.ok()) return s;
    }
    return in.empty() ? absl::OkStatus() : Feed(in);
  }

  // Checks and feeds the held first bytes (at the stream's end: however few there are).
  absl::Status TakeHead() {
    if (absl::Status s = CheckHead(); !s.ok()) return s;
    const std::string held = std::exchange(head, {});
    if (held.empty()) return absl::OkStatus();
    return Feed({reinterpret_cast<const uint8_t*>(held.data()), held.size()});
  }

  absl::Status Feed(std::span<const uint8_t> in) {
    if (compression == Compression::kNone) return Parse(in);
    std::vector<uint8_t> chunk(kOutChunk);
    if (compression == Compression::kGzip) {
      z.next_in = const_cast<Bytef*>(in.data());
      z.avail_in = static_cast<uInt>(in.size());
      // Until the input is used up and the inflater has nothing more to give.
      while (true) {
        if (stream_ended && z.avail_in > 0) {  // another gzip member follows
          if (inflateReset(&z) != Z_OK) return Bad("gzip: cannot start the next member");
          stream_ended = false;
        }
        z.next_out = chunk.data();
        z.avail_out = static_cast<uInt>(chunk.size());
        int rc = stream_ended ? Z_STREAM_END : inflate(&z, Z_NO_FLUSH);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
          return Bad(absl::StrCat("gzip: ", z.msg ? z.msg : "corrupt stream"));
        }
        size_t produced = chunk.size() - z.avail_out;
        if (absl::Status s = Parse({chunk.data(), produced}); !s.ok()) return s;
        if (rc == Z_STREAM_END) stream_ended = true;
        if (z.avail_in == 0 && (z.avail_out > 0 || stream_ended)) break;
      }
      return absl::OkStatus();
    }
    ZSTD_inBuffer zin{in.data(), in.size(), 0};
    while (true) {
      const size_t before = zin.pos;
      ZSTD_outBuffer zout{chunk.data(), chunk.size(), 0};
      size_t rc = ZSTD_decompressStream(zstd, &zout, &zin);
      if (ZSTD_isError(rc)) return Bad(absl::StrCat("zstd: ", ZSTD_getErrorName(rc)));
      if (absl::Status s = Parse({chunk.data(), zout.pos}); !s.ok()) return s;
      if (rc == 0) {
        stream_ended = true;  // a frame ended and everything of it was given
      } else if (zin.pos > before || zout.pos > 0) {
        stream_ended = false;
      }
      if (zin.pos == zin.size && zout.pos < zout.size) break;
    }
    return absl::OkStatus();
  }
};

TarLayer::TarLayer(std::string label, Compression compression, uint64_t* budget)
    : impl_(std::make_unique<Impl>()) {
  impl_->label = std::move(label);
  impl_->compression = compression;
  impl_->budget = budget;
  if (compression == Compression::kGzip) {
    impl_->z_open = inflateInit2(&impl_->z, 16 + MAX_WBITS) == Z_OK;
  } else if (compression == Compression::kZstd) {
    impl_->zstd = ZSTD_createDCtx();
  }
}

TarLayer::~TarLayer() {
  if (impl_->z_open) inflateEnd(&impl_->z);
  if (impl_->zstd != nullptr) ZSTD_freeDCtx(impl_->zstd);
}

absl::Status TarLayer::Feed(std::span<const uint8_t> compressed) {
  if ((impl_->compression == Compression::kGzip && !impl_->z_open) ||
      (impl_->compression == Compression::kZstd && impl_->zstd == nullptr)) {
    return absl::InternalError(absl::StrCat(impl_->label, ": cannot start the decompressor"));
  }
  return impl_->Take(compressed);
}

absl::StatusOr<std::vector<TarEntry>> TarLayer::Finish() {
  Impl& i = *impl_;
  if (!i.head_checked) {
    if (absl::Status s = i.TakeHead(); !s.ok()) return s;
  }
  if (i.compression != Compression::kNone && !i.stream_ended) {
    return i.Bad("the compressed stream ends early");
  }
  // An archive without its two zero blocks is accepted only between entries.
  if (i.state != Impl::State::kEnd &&
      !(i.state == Impl::State::kHeader && i.block.empty() && !i.next_path && !i.next_size &&
        !i.pax_pending && !i.long_pending)) {
    return i.Bad("the archive ends inside an entry");
  }
  return std::move(i.out);
}

}  // namespace ckpt::oci
