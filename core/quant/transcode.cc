#include "core/quant/transcode.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint.h"
#include "core/io/fd.h"
#include "core/io/tree_stream.h"
#include "core/parallel.h"
#include "core/quant/codecs.h"
#include "core/quant/gpt_oss_cast.h"
#include "core/quant/gpt_oss_pair.h"
#include "core/quant/quant_weight.h"
#include "core/quant/safetensors_writer.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"

namespace ckpt::quant {
namespace {

using io::Fd;

namespace fs = std::filesystem;

constexpr char kRunRecord[] = ".transcode-run.json";
constexpr uint64_t kIoChunk = 8ull << 20;  // compare and hash buffers, one per thread

std::string Errno() { return std::strerror(errno); }

absl::Status WriteAt(int fd, const std::string& label, uint64_t offset,
                     std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const ssize_t w = ::pwrite(fd, bytes.data(), std::min<size_t>(bytes.size(), 1u << 30), offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return absl::DataLossError(absl::StrCat(label, ": cannot write ", bytes.size(),
                                              " bytes at offset ", offset, ": ",
                                              w < 0 ? Errno() : "nothing written"));
    }
    bytes = bytes.subspan(static_cast<size_t>(w));
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

// Up to out.size() bytes at `offset` (fewer at end of file).
absl::StatusOr<size_t> ReadAt(int fd, const std::string& label, uint64_t offset,
                              std::span<uint8_t> out) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + got, out.size() - got, offset + got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return absl::DataLossError(
          absl::StrCat(label, ": cannot read at offset ", offset + got, ": ", Errno()));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

absl::Status Fsync(int fd, const std::string& label) {
  if (::fsync(fd) != 0) return absl::DataLossError(absl::StrCat(label, ": fsync: ", Errno()));
  return absl::OkStatus();
}

// A small file written whole into `dir` (replacing one an interrupted run left), fsynced.
absl::Status WriteSmallFile(int dir, const std::string& dir_label, const std::string& name,
                            std::span<const uint8_t> bytes) {
  const std::string label = absl::StrCat(dir_label, "/", name);
  Fd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.ok()) return absl::DataLossError(absl::StrCat(label, ": cannot create: ", Errno()));
  if (absl::Status s = WriteAt(fd.get(), label, 0, bytes); !s.ok()) return s;
  return Fsync(fd.get(), label);
}

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string PolicyFailure(const ScaleWindowResult& r) {
  const FindingList& list = r.verdict == ScaleWindowVerdict::kNaNScale ? r.nan_scales : r.over_span;
  std::string msg = absl::StrCat("scale-window policy ", r.config.id(), ": ", VerdictName(r.verdict),
                                 ", ", list.total(), " group(s); nothing was written");
  size_t shown = 0;
  for (const Finding& f : list.kept()) {
    if (f.code == "nan-scale-zero-group") continue;
    if (++shown > 5) break;
    absl::StrAppend(&msg, "; ", f.ToText());
  }
  return msg;
}

// What a layout names and how it encodes one module's cast (transcode.h; docs/quant.md
// "Transcode"). Block scales of active groups are the same bytes in every layout.
struct LayoutSpec {
  TranscodeLayout layout;
  const char* packed;  // suffix of the packed weight
  const char* global;  // suffix of the global scale
  std::vector<uint64_t> global_shape;
  bool global_divides;       // compressed-tensors: value = e2m1 x scale / global
  uint8_t zero_group_scale;  // E4M3 byte of both blocks of an all-zero group
};

// compressed-tensors as the bundled fixture has it: a [1] divisor, +0 on all-zero groups
// (docs/formats.md §5). ModelOpt as its exporter writes it: `weight`, the 0-d multiplier
// `weight_scale_2`, and 1.0 where a block's amax is zero, since ModelOpt never writes a zero
// block scale (docs/formats.md §9).
const LayoutSpec& SpecOf(TranscodeLayout layout) {
  static const LayoutSpec kCompressedTensors{TranscodeLayout::kCompressedTensors, kPackedSuffix,
                                             kGlobalScaleSuffix, {1}, true, 0x00};
  static const LayoutSpec kModelOpt{TranscodeLayout::kModelOpt, ".weight", ".weight_scale_2",
                                    {}, false,
                                    static_cast<uint8_t>(EncodeE4M3PowerOfTwo(0))};
  return layout == TranscodeLayout::kModelOpt ? kModelOpt : kCompressedTensors;
}

// The derived tensors of one MXFP4 module: E4M3 block scales and the global scale.
struct DerivedScales {
  std::vector<uint8_t> block_scales;
  float global_scale = 1.0f;
  uint64_t zero_groups = 0;
};

// The global is 2^(k_max - 8) in effect: a multiplier 2^(k_max - 8) (ModelOpt, exact in F32 for
// every E8M0 k_max, subnormal below k_max = -118) or a divisor 2^(8 - k_max), which F32 cannot
// hold below k_max = -119: FAILED_PRECONDITION, never an infinite global.
absl::StatusOr<DerivedScales> DeriveScales(const QuantWeight& w, int k_max,
                                           const LayoutSpec& spec) {
  absl::StatusOr<Mxfp4View> v = Mxfp4ViewOf(w);
  if (!v.ok()) return v.status();
  DerivedScales d;
  const int global_log2 = spec.global_divides ? 8 - k_max : k_max - 8;
  d.global_scale = std::ldexp(1.0f, global_log2);
  if (!std::isfinite(d.global_scale)) {
    return absl::FailedPreconditionError(
        absl::StrCat(w.module, ": its global scale 2^", global_log2, " (k_max ", k_max,
                     ") is beyond F32 in the ", TranscodeLayoutName(spec.layout),
                     " layout; ModelOpt's 2^(k_max - 8) holds it (--layout modelopt)"));
  }
  const uint64_t groups = v->groups_per_row();
  d.block_scales.assign(w.rows * groups * 2, spec.zero_group_scale);
  for (uint64_t r = 0; r < w.rows; ++r) {
    for (uint64_t g = 0; g < groups; ++g) {
      if (!v->GroupActive(r, g)) {
        ++d.zero_groups;  // canonical scale: values are zero whatever the scale
        continue;
      }
      const int e = EncodeE4M3PowerOfTwo(E8M0Exponent(v->ScaleByte(r, g)) - k_max + 8);
      if (e < 0 || v->ScaleByte(r, g) == kE8M0NaN) {
        return absl::FailedPreconditionError(
            absl::StrCat(w.module, " row ", r, " group ", g, ": scale outside the E4M3 window"));
      }
      d.block_scales[(r * groups + g) * 2] = d.block_scales[(r * groups + g) * 2 + 1] =
          static_cast<uint8_t>(e);
    }
  }
  return d;
}

std::vector<uint8_t> F32Bytes(float f) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &f, 4);
  return b;
}

// Test hook (tests/quant/cli_test.cc): the process kills itself with SIGKILL right after its
// N-th tensor (or header) write, to leave what a crash mid-shard leaves.
void MaybeKillForTest() {
  static const uint64_t after = [] {
    const char* v = std::getenv("CKPT_AUDIT_TEST_KILL_AFTER_WRITES");
    return v == nullptr ? 0 : std::strtoull(v, nullptr, 10);
  }();
  static std::atomic<uint64_t> writes{0};
  if (after != 0 && ++writes == after) std::raise(SIGKILL);
}

// One output shard: laid out from its source header, written tensor by tensor at its offsets.
struct OutShard {
  std::string rel;    // relative to DST, the source shard's name
  std::string label;  // the temporary path, for messages
  SafetensorsLayout layout;
  std::map<std::string, size_t> index;  // tensor name -> position in layout
  Fd fd;
  bool existed = false;  // resume: left by the interrupted run; compared before written
  std::atomic<bool> differed{false};
  std::atomic<uint64_t> placed{0};    // bytes placed: the shard is complete at file_size
  std::function<void()> on_complete;  // set before the stream: hands the shard to a Finisher
  bool finished = false;              // Finish ran (sha256 is set)
  Digest sha256{};

  // Writes `bytes` at `offset`; for a file the interrupted run left, only the chunks that
  // differ from what it holds (a chunk it did not reach reads short and is written). `last`:
  // the end of a tensor (or the header).
  absl::Status Place(uint64_t offset, std::span<const uint8_t> bytes, bool last) {
    if (existed) {
      thread_local std::vector<uint8_t> buf;
      buf.resize(std::min<uint64_t>(kIoChunk, std::max<size_t>(bytes.size(), 1)));
      for (uint64_t done = 0; done < bytes.size();) {
        const auto want = bytes.subspan(done, std::min<uint64_t>(buf.size(), bytes.size() - done));
        absl::StatusOr<size_t> got = ReadAt(fd.get(), label, offset + done,
                                            std::span<uint8_t>(buf.data(), want.size()));
        if (!got.ok()) return got.status();
        if (*got != want.size() || !std::equal(want.begin(), want.end(), buf.begin())) {
          differed = true;
          if (absl::Status s = WriteAt(fd.get(), label, offset + done, want); !s.ok()) return s;
        }
        done += want.size();
      }
    } else if (absl::Status s = WriteAt(fd.get(), label, offset, bytes); !s.ok()) {
      return s;
    }
    if (last) MaybeKillForTest();
    if (placed.fetch_add(bytes.size()) + bytes.size() == layout.file_size && on_complete) {
      on_complete();
    }
    return absl::OkStatus();
  }

  absl::Status Put(const std::string& tensor, std::span<const uint8_t> bytes) {
    auto it = index.find(tensor);
    if (it == index.end() || layout.sizes[it->second] != bytes.size()) {
      return absl::InternalError(absl::StrCat(label, ": ", tensor, " does not fit its layout"));
    }
    return Place(layout.offsets[it->second], bytes, /*last=*/true);
  }

  // A piece of a tensor written in pieces: `bytes` at `at` inside it; `last`: its final piece.
  absl::Status PutPiece(const std::string& tensor, uint64_t at, std::span<const uint8_t> bytes,
                        bool last) {
    auto it = index.find(tensor);
    if (it == index.end() || at + bytes.size() > layout.sizes[it->second]) {
      return absl::InternalError(absl::StrCat(label, ": ", tensor, " does not fit its layout"));
    }
    return Place(layout.offsets[it->second] + at, bytes, last);
  }

  // Every tensor is in: cut what an interrupted run left beyond the end, fsync, and hash the
  // file front to back.
  absl::Status Finish() {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) {
      return absl::DataLossError(absl::StrCat(label, ": fstat: ", Errno()));
    }
    if (static_cast<uint64_t>(st.st_size) != layout.file_size) {
      differed = true;
      if (::ftruncate(fd.get(), static_cast<off_t>(layout.file_size)) != 0) {
        return absl::DataLossError(absl::StrCat(label, ": cannot truncate to ", layout.file_size,
                                                " bytes: ", Errno()));
      }
    }
    // SHA-256 is sequential and the layout puts the global scales first: they depend on every
    // packed byte of their fused group, so the digest cannot be taken in order while writing
    // without holding the shard; it is taken here, from the file this process wrote, through
    // the same descriptor, while the fsync runs beside it; the directory is published only
    // after both.
    absl::Status synced;
    std::thread syncer;
    try {
      syncer = std::thread([&] { synced = Fsync(fd.get(), label); });
    } catch (const std::system_error&) {  // no thread to spare: fsync first, then hash
      synced = Fsync(fd.get(), label);
    }
    // Each chunk is hashed on the relay's thread while the next is read into the other buffer
    // (docs/quant.md): the hash is the read-back's pace, the copy from the page cache is not.
    Sha256 h;
    absl::Status read = absl::OkStatus();
    const uint64_t chunk = std::min<uint64_t>(kIoChunk, std::max<uint64_t>(layout.file_size, 1));
    std::vector<uint8_t> bufs[2] = {std::vector<uint8_t>(chunk), std::vector<uint8_t>(chunk)};
    Relay hasher;
    for (uint64_t pos = 0, k = 0; pos < layout.file_size && read.ok(); ++k) {
      std::vector<uint8_t>& buf = bufs[k % 2];
      const size_t n = std::min<uint64_t>(chunk, layout.file_size - pos);
      absl::StatusOr<size_t> got = ReadAt(fd.get(), label, pos, std::span<uint8_t>(buf.data(), n));
      hasher.Wait().IgnoreError();  // the other buffer's hash: it is read into next
      if (!got.ok()) {
        read = got.status();
      } else if (*got != n) {
        read = absl::DataLossError(absl::StrCat(label, ": ends at ", pos + *got));
      } else {
        hasher.Post([&h, bytes = std::span<const uint8_t>(buf.data(), n)] {
          h.Update(bytes);
          return absl::OkStatus();
        });
        pos += n;
      }
    }
    hasher.Wait().IgnoreError();
    if (syncer.joinable()) syncer.join();
    if (!synced.ok()) return synced;
    if (!read.ok()) return read;
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);  // written, hashed: not kept cached
    sha256 = h.Finish();
    fd.Reset();
    finished = true;
    return absl::OkStatus();
  }
};

// One gpt-oss stacked tensor `base` cast (gpt_oss_cast.h) and written, one expert at a time, so
// only one expert's output is held beside the source tensor: the codes transposed, the E4M3
// block scales, then one weight_scale_2 (the names GptOssEntries planned). Returns its all-zero
// groups (block scale +0, as the cast writes them). FAILED_PRECONDITION from the cast names
// tensor, expert, row and block.
absl::StatusOr<uint64_t> CastGptOss(const Checkpoint& src, const gptoss::Dims& d,
                                    const std::string& base, OutShard& out) {
  const gptoss::Fused f = absl::EndsWith(base, gptoss::FusedName(gptoss::Fused::kGateUp))
                              ? gptoss::Fused::kGateUp
                              : gptoss::Fused::kDown;
  absl::StatusOr<gptoss::ModelOptCaster> c = gptoss::ModelOptCaster::Make(
      base, d, f, src.Find(base + "_blocks")->bytes(), src.Find(base + "_scales")->bytes());
  if (!c.ok()) return c.status();
  std::vector<uint8_t> packed(c->expert_packed_bytes()), scales(c->expert_scale_bytes());
  uint64_t zero_groups = 0;
  for (uint64_t e = 0; e < d.experts; ++e) {
    absl::StatusOr<uint64_t> z = c->CastExpert(e, packed, scales);
    if (!z.ok()) return z.status();
    zero_groups += *z;
    const bool last = e + 1 == d.experts;
    absl::Status s = out.PutPiece(base, e * packed.size(), packed, last);
    if (s.ok()) s = out.PutPiece(base + "_weight_scale", e * scales.size(), scales, last);
    if (!s.ok()) return s;
  }
  if (absl::Status s = out.Put(base + "_weight_scale_2", F32Bytes(c->weight_scale_2())); !s.ok()) {
    return s;
  }
  return zero_groups;
}

// Finishes (hashes and fsyncs) output shards on threads of its own as soon as their last byte
// is placed, beside the stream, while their pages are still cached: otherwise every shard of a
// 96-shard checkpoint would be read back from storage after the whole source had been read.
class Finisher {
 public:
  explicit Finisher(unsigned threads) {
    // Fewer threads when the system refuses more: what none finishes, the end of the
    // transcode does.
    try {
      for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
    } catch (const std::system_error&) {
    }
  }
  ~Finisher() { Close().IgnoreError(); }

  void Add(OutShard* shard) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(shard);
    cv_.notify_one();
  }

  // Finishes what was added and stops; the first error of a Finish.
  absl::Status Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
    return status_;
  }

 private:
  void Loop() {
    for (;;) {
      OutShard* shard;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        shard = queue_.front();
        queue_.pop_front();
      }
      absl::Status s = shard->Finish();
      std::lock_guard<std::mutex> lock(mu_);
      if (status_.ok()) status_ = std::move(s);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<OutShard*> queue_;
  bool closed_ = false;
  absl::Status status_;
  std::vector<std::thread> workers_;
};

// flock on ".DST.transcode.lock" in the parent; the file is removed on release.
class DstLock {
 public:
  static absl::StatusOr<std::unique_ptr<DstLock>> Acquire(int parent,
                                                          const std::string& parent_label,
                                                          const std::string& name) {
    const std::string label = absl::StrCat(parent_label, "/", name);
    for (int attempt = 0; attempt < 100; ++attempt) {
      Fd fd(::openat(parent, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd.ok()) {
        return absl::AbortedError(absl::StrCat(label, ": cannot open the lock file: ", Errno()));
      }
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        return absl::AbortedError(absl::StrCat(
            "another transcode to the same destination is running (it holds ", label, ")"));
      }
      // The file may have been removed by the holder we waited for: lock the one the name
      // leads to now.
      struct stat held, now;
      if (::fstat(fd.get(), &held) == 0 &&
          ::fstatat(parent, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
          held.st_dev == now.st_dev && held.st_ino == now.st_ino) {
        return std::unique_ptr<DstLock>(new DstLock(parent, name, std::move(fd)));
      }
    }
    return absl::AbortedError(absl::StrCat(label, ": lock file keeps changing"));
  }
  ~DstLock() { ::unlinkat(parent_, name_.c_str(), 0); }

 private:
  DstLock(int parent, std::string name, Fd fd)
      : parent_(parent), name_(std::move(name)), fd_(std::move(fd)) {}
  int parent_;
  std::string name_;
  Fd fd_;
};

// What identifies a run: its target, layout, policy and the source as read (every file's
// identity).
// Written into the temporary directory when it is made; --resume continues only a directory
// whose record equals the current one.
nlohmann::json RunRecord(const TreeImage& source, const ScaleWindowConfig& policy,
                         TranscodeLayout layout) {
  nlohmann::json files = nlohmann::json::array();
  for (const ImageFile& f : source.files) {
    const io::FileIdentity& id = f.identity;
    files.push_back({{"name", f.name}, {"size", id.size}, {"device", id.device},
                     {"inode", id.inode}, {"mtime_ns", id.mtime_ns}, {"ctime_ns", id.ctime_ns}});
  }
  return {{"version", 1}, {"target", "nvfp4"}, {"layout", TranscodeLayoutName(layout)},
          {"policy", policy.id()},
          {"source", EncodeName(source.root)}, {"files", files}};
}

// OK when `stored` (an interrupted run's record in `tmp_label`) is this run's; ALREADY_EXISTS
// when it is another run's, ABORTED when the source changed since.
absl::Status MatchRecord(const nlohmann::json& stored, const nlohmann::json& now,
                         const std::string& tmp_label) {
  for (const char* key : {"version", "target", "layout", "policy", "source"}) {
    if (!stored.contains(key) || stored[key] != now[key]) {
      return absl::AlreadyExistsError(absl::StrCat(
          tmp_label, ": it belongs to another run (", key, " ",
          stored.contains(key) ? DumpJson(stored[key]) : "missing", ", this run: ",
          DumpJson(now[key]), ")"));
    }
  }
  std::map<std::string, nlohmann::json> before;
  if (stored.contains("files") && stored["files"].is_array()) {
    for (const nlohmann::json& f : stored["files"]) {
      if (f.is_object() && f.contains("name") && f["name"].is_string()) {
        before[f["name"].get<std::string>()] = f;
      }
    }
  }
  for (const nlohmann::json& f : now["files"]) {
    const std::string name = f["name"].get<std::string>();
    auto it = before.find(name);
    if (it == before.end()) {
      return absl::AbortedError(absl::StrCat(
          tmp_label, ": the source changed since the interrupted run: ", name, " was added"));
    }
    if (it->second != f) {
      return absl::AbortedError(absl::StrCat(tmp_label,
                                             ": the source changed since the interrupted run: ",
                                             name, " was modified (size, inode or times)"));
    }
    before.erase(it);
  }
  if (!before.empty()) {
    return absl::AbortedError(absl::StrCat(tmp_label,
                                           ": the source changed since the interrupted run: ",
                                           before.begin()->first, " was removed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ReadRunRecord(int tmp, const std::string& tmp_label) {
  Fd fd(::openat(tmp, kRunRecord, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        tmp_label, ": it belongs to another run (no readable ", kRunRecord, ": ", Errno(), ")"));
  }
  std::vector<uint8_t> bytes(1 << 20);
  absl::StatusOr<size_t> got = ReadAt(fd.get(), tmp_label, 0, bytes);
  if (!got.ok()) return got.status();
  bytes.resize(*got);
  absl::StatusOr<nlohmann::json> j = ParseJsonDocument(bytes, tmp_label + "/" + kRunRecord);
  if (!j.ok() || !j->is_object()) {
    return absl::AlreadyExistsError(absl::StrCat(
        tmp_label, ": it belongs to another run (", kRunRecord, " does not parse)"));
  }
  return *std::move(j);
}

// The output directory being built, its lock and whether a failure removes it.
struct Staging {
  Fd parent;
  std::string parent_label, dst_name, tmp_name, tmp_label;
  std::unique_ptr<DstLock> lock;
  Fd tmp;
  std::vector<std::string> resumed;  // resume: the entries the interrupted run left
  bool remove_on_failure = false;  // a run the policy refused can never be continued

  absl::Status Fail(absl::Status s) {
    if (!tmp.ok()) return s;
    if (remove_on_failure) {
      std::error_code ec;
      fs::remove_all(tmp_label, ec);
    } else if (s.code() != absl::StatusCode::kInvalidArgument &&
               s.code() != absl::StatusCode::kFailedPrecondition) {
      s = absl::Status(s.code(), absl::StrCat(s.message(), "; nothing was published, ", tmp_label,
                                              " is kept: `transcode --resume` continues"));
    }
    return s;
  }
};

absl::StatusOr<Staging> OpenParent(const std::string& dst) {
  Staging st;
  const fs::path path = fs::absolute(dst).lexically_normal();
  fs::path name = path.filename();
  fs::path parent = path.parent_path();
  if (name.empty()) {  // "out/" normalizes to "out/" with an empty filename
    name = parent.filename();
    parent = parent.parent_path();
  }
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(dst, ": not a directory name to create"));
  }
  st.dst_name = name.string();
  st.parent.Reset();
  st.parent = Fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!st.parent.ok()) {
    const int err = errno;
    const std::string msg = absl::StrCat(parent.string(), ": the parent of ", dst,
                                         " cannot be opened: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  absl::StatusOr<std::string> real = RealPath(parent.string());
  st.parent_label = real.ok() ? *real : parent.string();
  st.tmp_name = "." + st.dst_name + ".transcode-tmp";
  st.tmp_label = absl::StrCat(st.parent_label, "/", st.tmp_name);
  return st;
}

// The entries of a temporary directory that only this process's user can have written
// (docs/quant.md, "Only our own directory is continued"): the directory `dir` (opened without following a link) owned by
// that user with mode 0700, and every entry a regular file owned by that user with one link.
// Anything else another user may have made, or may still rewrite after we publish and sign it:
// FAILED_PRECONDITION naming the directory or the entry.
absl::StatusOr<std::vector<std::string>> OwnStagingEntries(int dir, const std::string& label) {
  const uid_t me = ::geteuid();
  auto refuse = [&](const std::string& what, const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", why, "; only a temporary directory that this user alone can have written "
        "(mode 0700, every entry a regular file of this user with one link) is continued"));
  };
  struct stat d;
  if (::fstat(dir, &d) != 0) return absl::DataLossError(absl::StrCat(label, ": ", Errno()));
  if (d.st_uid != me) {
    return refuse(label, absl::StrCat("is owned by uid ", d.st_uid, ", not by uid ", me));
  }
  if ((d.st_mode & 07777) != 0700) {
    return refuse(label, absl::StrFormat("has mode %04o, not 0700", d.st_mode & 07777));
  }
  const int listing = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* stream = listing >= 0 ? ::fdopendir(listing) : nullptr;  // owns `listing` from here
  if (stream == nullptr) {
    const std::string error = Errno();
    if (listing >= 0) ::close(listing);
    return absl::DataLossError(absl::StrCat(label, ": cannot list: ", error));
  }
  std::vector<std::string> names;
  absl::Status status;
  while (const dirent* e = ::readdir(stream)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string shown = absl::StrCat(label, "/", EncodeName(name));
    struct stat f;
    if (::fstatat(dir, name.c_str(), &f, AT_SYMLINK_NOFOLLOW) != 0) {
      status = absl::DataLossError(absl::StrCat(shown, ": ", Errno()));
    } else if (!S_ISREG(f.st_mode)) {
      status = refuse(shown, "is not a regular file");
    } else if (f.st_uid != me) {
      status = refuse(shown, absl::StrCat("is owned by uid ", f.st_uid, ", not by uid ", me));
    } else if (f.st_nlink != 1) {
      status = refuse(shown, absl::StrCat("has ", f.st_nlink, " links"));
    }
    if (!status.ok()) break;
    names.push_back(name);
  }
  ::closedir(stream);
  if (!status.ok()) return status;
  return names;
}

// Makes (fresh) or opens (resume) the temporary directory, refusing one that is a link, that
// is not a directory, that belongs to another run or user (OwnStagingEntries) or, without
// resume, that exists at all; --resume is suggested only for one it would continue.
absl::Status OpenStaging(Staging& st, const nlohmann::json& record, bool resume) {
  struct stat s;
  const bool exists = ::fstatat(st.parent.get(), st.tmp_name.c_str(), &s, AT_SYMLINK_NOFOLLOW) == 0;
  if (exists && S_ISLNK(s.st_mode)) {
    return absl::AlreadyExistsError(absl::StrCat(
        st.tmp_label, ": the temporary name is a symbolic link; not following it"));
  }
  if (exists && !S_ISDIR(s.st_mode)) {
    return absl::AlreadyExistsError(
        absl::StrCat(st.tmp_label, ": the temporary name exists and is not a directory"));
  }
  if (!resume && exists) {
    absl::StatusOr<nlohmann::json> stored;
    Fd dir(::openat(st.parent.get(), st.tmp_name.c_str(),
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir.ok() && OwnStagingEntries(dir.get(), st.tmp_label).ok()) {
      stored = ReadRunRecord(dir.get(), st.tmp_label);
    }
    if (stored.ok() && MatchRecord(*stored, record, st.tmp_label).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          st.tmp_label, ": an interrupted transcode of this source left it; continue it with "
                        "--resume, or remove it"));
    }
    return absl::AlreadyExistsError(absl::StrCat(
        st.tmp_label, ": the temporary name exists and belongs to another run; not touching it"));
  }
  if (resume && !exists) {
    return absl::NotFoundError(absl::StrCat(
        "--resume: no temporary directory ", st.tmp_label, " from an interrupted run"));
  }
  if (!exists && ::mkdirat(st.parent.get(), st.tmp_name.c_str(), 0700) != 0) {
    return absl::DataLossError(absl::StrCat(st.tmp_label, ": cannot create: ", Errno()));
  }
  st.tmp = Fd(::openat(st.parent.get(), st.tmp_name.c_str(),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!st.tmp.ok()) {
    return absl::DataLossError(absl::StrCat(st.tmp_label, ": cannot open: ", Errno()));
  }
  if (exists) {
    auto own = OwnStagingEntries(st.tmp.get(), st.tmp_label);
    if (!own.ok()) {
      st.tmp.Reset();  // not ours: never removed
      return absl::Status(own.status().code(),
                          absl::StrCat("--resume: ", own.status().message()));
    }
    st.resumed = *std::move(own);
    absl::StatusOr<nlohmann::json> stored = ReadRunRecord(st.tmp.get(), st.tmp_label);
    if (!stored.ok()) {
      st.tmp.Reset();
      return stored.status();
    }
    if (absl::Status m = MatchRecord(*stored, record, st.tmp_label); !m.ok()) {
      st.tmp.Reset();  // not ours: never removed
      return absl::Status(m.code(), absl::StrCat("--resume: ", m.message()));
    }
    return absl::OkStatus();
  }
  if (absl::Status w =
          WriteSmallFile(st.tmp.get(), st.tmp_label, kRunRecord, AsBytes(DumpJson(record, 2)));
      !w.ok()) {
    return w;
  }
  if (absl::Status f = Fsync(st.tmp.get(), st.tmp_label); !f.ok()) return f;
  return Fsync(st.parent.get(), st.parent_label);
}

// What the transcode writes, planned from the source headers.
struct Plan {
  std::vector<std::unique_ptr<OutShard>> shards;
  std::map<std::string, size_t> module_shard;  // MXFP4 module -> output shard
  struct Copy {
    size_t shard;
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  std::vector<Copy> copies;  // tensors carried over unchanged, written as they stream past
};

// The ModelOpt tensors (name, dtype, shape) a gpt-oss stacked tensor `blocks` (`X_blocks`)
// becomes: X, X_weight_scale and X_weight_scale_2 (docs/quant.md "gpt-oss layouts"; its bias is
// carried over). INVALID_ARGUMENT when X is neither gate_up_proj nor down_proj or `blocks` is
// not U8 [E, R, C/32, 16] for the config's geometry.
absl::StatusOr<std::vector<TensorEntry>> GptOssEntries(const TensorInfo& blocks,
                                                       const gptoss::Dims& d) {
  const std::string base = blocks.name.substr(0, blocks.name.size() - strlen("_blocks"));
  for (gptoss::Fused f : {gptoss::Fused::kGateUp, gptoss::Fused::kDown}) {
    const std::string fused = gptoss::FusedName(f);
    if (!absl::EndsWith(base, "." + fused)) continue;
    const std::vector<uint64_t> want = {d.experts, d.Rows(f), d.Cols(f) / 32, 16};
    if (blocks.dtype != DType::kU8 || blocks.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          blocks.name, ": ", DTypeName(blocks.dtype), " ", absl::StrJoin(blocks.shape, "x"),
          ", the config's geometry needs U8 ", absl::StrJoin(want, "x")));
    }
    std::vector<TensorEntry> out;
    for (gptoss::TensorSpec& t :
         gptoss::ModelOptTensors(base.substr(0, base.size() - fused.size()), d, f,
                                 /*w4a4=*/false, DType::kBF16)) {
      if (t.name != base + "_bias") out.push_back({std::move(t.name), t.dtype, t.shape});
    }
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(blocks.name, ": a gpt-oss stacked tensor is gate_up_proj or down_proj"));
}

// `gpt_oss`: the source's geometry when it is gpt-oss MXFP4 (its `X_blocks`/`X_scales` become
// ModelOpt's gpt-oss tensors; module_shard is keyed by X).
absl::StatusOr<Plan> PlanOutput(const Checkpoint& src, const std::string& tmp_label,
                                const LayoutSpec& spec, const gptoss::Dims* gpt_oss) {
  Plan plan;
  std::set<std::string> modules;
  for (const std::string& m : PackedModules(src)) modules.insert(m);
  std::set<std::string> stacked;
  if (gpt_oss) {
    for (std::string& b : GptOssExpertBases(src)) stacked.insert(std::move(b));
  }
  // A derived name may also be a source tensor's (a stray M.weight beside M.weight_packed):
  // refused, wherever each would land, rather than written twice.
  std::map<std::string, std::string> written;  // output tensor -> its source tensor
  for (const auto& shard : src.shards()) {
    auto out = std::make_unique<OutShard>();
    out->rel = src.RelativePath(*shard);
    if (out->rel.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(src.root(), "/", out->rel,
                                                     ": transcode writes top-level shards only"));
    }
    out->label = absl::StrCat(tmp_label, "/", out->rel);
    std::vector<TensorEntry> entries;
    for (const TensorInfo& t : shard->tensors()) {
      const size_t first = entries.size();
      if (absl::EndsWith(t.name, kPackedSuffix)) {
        const std::string m = t.name.substr(0, t.name.size() - strlen(kPackedSuffix));
        if (t.shape.size() != 2 || (t.shape[1] * 2) % 32 != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(t.name, ": not an MXFP4 packed weight (rows x 16k bytes)"));
        }
        entries.push_back({m + spec.packed, t.dtype, t.shape});
        entries.push_back({m + kScaleSuffix, DType::kF8_E4M3, {t.shape[0], t.shape[1] * 2 / 16}});
        entries.push_back({m + spec.global, DType::kF32, spec.global_shape});
        plan.module_shard[m] = plan.shards.size();
      } else if (gpt_oss && absl::EndsWith(t.name, "_blocks")) {
        absl::StatusOr<std::vector<TensorEntry>> e = GptOssEntries(t, *gpt_oss);
        if (!e.ok()) return e.status();
        for (TensorEntry& x : *e) entries.push_back(std::move(x));
        plan.module_shard[t.name.substr(0, t.name.size() - strlen("_blocks"))] =
            plan.shards.size();
      } else if (absl::EndsWith(t.name, "_scales") &&
                 stacked.count(t.name.substr(0, t.name.size() - strlen("_scales")))) {
        continue;  // replaced by the derived E4M3 block scales
      } else if (absl::EndsWith(t.name, kScaleSuffix) &&
                 modules.count(t.name.substr(0, t.name.size() - strlen(kScaleSuffix)))) {
        continue;  // replaced by the derived E4M3 scales
      } else {
        entries.push_back({t.name, t.dtype, t.shape});
        plan.copies.push_back({plan.shards.size(), shard.get(), &t});
      }
      for (size_t i = first; i < entries.size(); ++i) {
        auto [it, fresh] = written.emplace(entries[i].name, t.name);
        if (!fresh) {
          return absl::InvalidArgumentError(absl::StrCat(
              src.root(), ": the ", TranscodeLayoutName(spec.layout), " output would hold ",
              entries[i].name, " twice (from source tensors ", it->second, " and ", t.name,
              ")"));
        }
      }
    }
    absl::StatusOr<SafetensorsLayout> layout =
        LayOutSafetensors(out->label, std::move(entries), shard->metadata());
    if (!layout.ok()) return layout.status();
    out->layout = *std::move(layout);
    for (size_t i = 0; i < out->layout.tensors.size(); ++i) {
      out->index[out->layout.tensors[i].name] = i;
    }
    plan.shards.push_back(std::move(out));
  }
  return plan;
}

// Opens every output shard: created, or (resume) the interrupted run's file, compared first.
absl::Status OpenShards(Staging& st, Plan& plan, bool resume) {
  for (auto& s : plan.shards) {
    s->fd = Fd(::openat(st.tmp.get(), s->rel.c_str(),
                        O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!s->fd.ok() && errno == EEXIST && resume) {
      s->fd = Fd(::openat(st.tmp.get(), s->rel.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
      struct stat info;
      if (s->fd.ok() && (::fstat(s->fd.get(), &info) != 0 || !S_ISREG(info.st_mode))) {
        return absl::AlreadyExistsError(absl::StrCat(s->label, ": not a regular file"));
      }
      s->existed = s->fd.ok();
    }
    if (!s->fd.ok()) return absl::DataLossError(absl::StrCat(s->label, ": cannot open: ", Errno()));
    if (absl::Status w = s->Place(0, s->layout.prefix, /*last=*/true); !w.ok()) return w;
  }
  return absl::OkStatus();
}

// resume: everything in the temporary directory must be something this run writes.
absl::Status CheckStagingEntries(const Staging& st, const Plan& plan,
                                 const std::set<std::string>& small_files) {
  std::set<std::string> expected = small_files;
  expected.insert(kRunRecord);
  for (const auto& s : plan.shards) expected.insert(s->rel);
  for (const std::string& name : st.resumed) {
    if (!expected.count(name)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "--resume: ", st.tmp_label, " holds ", EncodeName(name),
          ", which this transcode does not write; it belongs to another run"));
    }
  }
  return absl::OkStatus();
}

// The modules ModelOpt's exporter lists in `exclude_modules` (docs/formats.md §9): those left
// unquantized that carry a weight of two or more dimensions (linear layers, embeddings, MoE
// routers; norms are 1-D), each summarized as its exporter does by the first of "P*", "P.*"
// (P a prefix of its name ending before a dot, shortest first) that matches no quantized
// module, else its own name; sorted. vLLM also takes entries as substrings of a module name,
// so an entry inside a quantized module's name, and a name holding an fnmatch wildcard
// character, are INVALID_ARGUMENT: the list cannot say what was left unquantized.
// `quantized` (sorted): the quantized modules, or gpt-oss's stacked expert tensors.
absl::StatusOr<std::vector<std::string>> ModelOptExcludeModules(
    const Checkpoint& src, const std::vector<std::string>& quantized) {
  const std::set<std::string> is_quantized(quantized.begin(), quantized.end());
  auto prefixes_quantized = [&](const std::string& prefix) {
    auto it = std::lower_bound(quantized.begin(), quantized.end(), prefix);
    return it != quantized.end() && absl::StartsWith(*it, prefix);
  };
  constexpr char kWeight[] = ".weight";
  std::set<std::string> unquantized;
  for (const auto& shard : src.shards()) {
    for (const TensorInfo& t : shard->tensors()) {
      if (t.shape.size() < 2 || !absl::EndsWith(t.name, kWeight)) continue;
      std::string m = t.name.substr(0, t.name.size() - strlen(kWeight));
      if (!is_quantized.count(m)) unquantized.insert(std::move(m));
    }
  }
  std::set<std::string> entries;
  for (const std::string& m : unquantized) {
    if (m.find_first_of("*?[") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          src.root(), ": module ", EncodeName(m), " holds an fnmatch wildcard character; "
          "ModelOpt's exclude_modules cannot name it"));
    }
    std::string entry = m;
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] != '.') continue;
      const std::string p = m.substr(0, i);
      if (!prefixes_quantized(p)) {
        entry = p + "*";
        break;
      }
      if (!is_quantized.count(p) && !prefixes_quantized(p + ".")) {
        entry = p + ".*";
        break;
      }
    }
    entries.insert(std::move(entry));
  }
  // As wildcards the entries match no quantized module (chosen so). As substrings: an entry
  // without '*', and the P of "P*", which vLLM splits into P and "P.*".
  for (const std::string& e : entries) {
    if (absl::EndsWith(e, ".*")) continue;
    const std::string literal = absl::EndsWith(e, "*") ? e.substr(0, e.size() - 1) : e;
    for (const std::string& q : quantized) {
      if (q.find(literal) != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            src.root(), ": unquantized module ", EncodeName(literal), " is part of the name of "
            "quantized module ", EncodeName(q), "; vLLM would leave both unquantized"));
      }
    }
  }
  return std::vector<std::string>(entries.begin(), entries.end());
}

// hf_quant_config.json as ModelOpt writes it for W4A16_NVFP4 (docs/formats.md §9). The producer
// must be "modelopt" for loaders to read it; the version names the ModelOpt development line
// whose exporter this layout follows, with a local label saying who wrote it.
nlohmann::json ModelOptHfQuantConfig(const std::vector<std::string>& exclude_modules) {
  return {{"producer", {{"name", "modelopt"}, {"version", "0.47.0.dev0+ckpt.audit"}}},
          {"quantization",
           {{"quant_algo", "W4A16_NVFP4"},
            {"kv_cache_quant_algo", nullptr},
            {"group_size", 16},
            {"exclude_modules", exclude_modules}}}};
}

// config.json's quantization_config as ModelOpt's exporter converts hf_quant_config.json for
// W4A16_NVFP4: weights only, no input_activations, no kv_cache_scheme (docs/formats.md §9).
nlohmann::json ModelOptQuantizationConfig(const nlohmann::json& hf_quant_config) {
  const nlohmann::json& q = hf_quant_config.at("quantization");
  nlohmann::json weights = {
      {"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", q.at("group_size")}};
  return {{"config_groups",
           {{"group_0", {{"weights", weights}, {"targets", nlohmann::json::array({"Linear"})}}}}},
          {"ignore", q.at("exclude_modules")},
          {"quant_algo", q.at("quant_algo")},
          {"producer", hf_quant_config.at("producer")},
          {"quant_method", "modelopt"}};
}

}  // namespace

std::string TranscodeLayoutName(TranscodeLayout layout) {
  return layout == TranscodeLayout::kModelOpt ? "modelopt" : "compressed-tensors";
}

absl::StatusOr<TranscodeLayout> ParseTranscodeLayout(const std::string& name) {
  for (TranscodeLayout l : {TranscodeLayout::kCompressedTensors, TranscodeLayout::kModelOpt}) {
    if (name == TranscodeLayoutName(l)) return l;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--layout: ", EncodeName(name), " is not a layout (compressed-tensors or modelopt)"));
}

nlohmann::json TranscodeResult::ToJson() const {
  return {{"layout", TranscodeLayoutName(layout)},
          {"policy", policy.ToJson()},
          {"files", files},
          {"tensors_written", tensors_written},
          {"modules_transcoded", modules_transcoded},
          {"bytes_written", bytes_written},
          {"zero_groups_canonicalized", zero_groups_canonicalized},
          {"zero_group_scale", zero_group_scale},
          {"shards_kept", shards_kept},
          {"shards_redone", shards_redone}};
}

nlohmann::json Nvfp4QuantizationConfig(const nlohmann::json& q) {
  nlohmann::json out = q;
  out["format"] = "nvfp4-pack-quantized";
  if (out.contains("config_groups") && out["config_groups"].is_object()) {
    for (auto& [name, group] : out["config_groups"].items()) {
      if (group.contains("weights") && group["weights"].is_object()) {
        group["weights"]["group_size"] = 16;
        group["weights"]["strategy"] = "tensor_group";
      }
    }
  }
  return out;
}

absl::StatusOr<TranscodeResult> TranscodeToNvfp4(const std::string& src_path,
                                                 const std::string& dst,
                                                 const TranscodeOptions& options,
                                                 Progress& progress) {
  absl::StatusOr<Staging> staging = OpenParent(dst);
  if (!staging.ok()) return staging.status();
  Staging& st = *staging;
  absl::StatusOr<std::unique_ptr<DstLock>> lock =
      DstLock::Acquire(st.parent.get(), st.parent_label, "." + st.dst_name + ".transcode.lock");
  if (!lock.ok()) return lock.status();
  st.lock = *std::move(lock);
  struct stat s;
  if (::fstatat(st.parent.get(), st.dst_name.c_str(), &s, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(dst, ": already exists; not overwriting"));
  }

  // The first half of the one read: small files and headers (docs/audit-engine.md).
  ReadOptions read;
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.threads = options.threads;
  read.memory_window = options.memory_window;
  read.tensor_digests = false;
  // The output can only be hashed once its last tensor is converted: the source's hash follows
  // the conversion instead of pacing it (docs/audit-engine.md, "Hashing behind the reads").
  read.hash_behind = true;
  auto image = ReadTree(src_path, read);
  if (!image.ok()) return image.status();
  auto opened = Checkpoint::Open(*image);
  if (!opened.ok()) return opened.status();
  const Checkpoint& src = **opened;
  const nlohmann::json& q = src.text_config().contains("quantization_config")
                                ? src.text_config()["quantization_config"]
                                : src.config().value("quantization_config", nlohmann::json());
  // gpt-oss MXFP4 (transformers' quant_method "mxfp4") goes to ModelOpt's gpt-oss layout, one
  // stacked tensor at a time through CastToModelOpt (docs/quant.md "gpt-oss layouts").
  const bool gpt_oss = src.layout() != CheckpointLayout::kX4TContainer && q.is_object() &&
                       q.value("quant_method", "") == "mxfp4";
  if (!gpt_oss && (src.layout() == CheckpointLayout::kX4TContainer || !q.is_object() ||
                   q.value("format", "") != "mxfp4-pack-quantized")) {
    return absl::InvalidArgumentError(
        absl::StrCat(src.root(), ": transcode needs a compressed-tensors mxfp4-pack-quantized "
                                 "or a gpt-oss mxfp4 checkpoint"));
  }
  if (gpt_oss && options.layout != TranscodeLayout::kModelOpt) {
    return absl::InvalidArgumentError(absl::StrCat(
        src.root(), ": gpt-oss MXFP4 transcodes to ModelOpt's gpt-oss layout only "
                    "(--layout modelopt)"));
  }
  std::optional<gptoss::Dims> dims;
  if (gpt_oss) {
    absl::StatusOr<gptoss::Dims> d = gptoss::DimsFromConfig(src.text_config());
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(src.root(), ": ", d.status().message()));
    }
    dims = *d;
  }
  const ScaleWindowPolicy policy(options.policy);
  absl::StatusOr<std::vector<ScaleWindowUnit>> units = policy.Plan(src);
  if (!units.ok()) return units.status();
  for (const ScaleWindowUnit& u : *units) {
    for (const auto& m : u.members) {
      if (m.gpt_oss_base.empty() == gpt_oss) {
        return absl::InvalidArgumentError(absl::StrCat(
            src.root(), ": ", m.name, gpt_oss ? " is a compressed-tensors module in a gpt-oss "
                                                "checkpoint" : " is a gpt-oss stacked tensor in a "
                                                "compressed-tensors checkpoint",
            "; not transcoded"));
      }
    }
  }
  const LayoutSpec& spec = SpecOf(options.layout);
  absl::StatusOr<Plan> planned = PlanOutput(src, st.tmp_label, spec, dims ? &*dims : nullptr);
  if (!planned.ok()) return planned.status();
  Plan& plan = *planned;
  // Other top-level files of the root (tokenizer, generation config) are carried over
  // unchanged, from the bytes that were read; config and index are rewritten, and ModelOpt's
  // hf_quant_config.json written.
  std::set<std::string> small_files = {"config.json"};
  nlohmann::json hf_quant_config;
  if (spec.layout == TranscodeLayout::kModelOpt) {
    absl::StatusOr<std::vector<std::string>> exclude =
        ModelOptExcludeModules(src, gpt_oss ? GptOssExpertBases(src) : PackedModules(src));
    if (!exclude.ok()) return exclude.status();
    hf_quant_config = ModelOptHfQuantConfig(*exclude);
    small_files.insert("hf_quant_config.json");
  }
  if (src.layout() == CheckpointLayout::kSharded) {
    small_files.insert("model.safetensors.index.json");
  }
  for (const ImageFile& f : src.image().files) {
    if (f.path.find('/') == std::string::npos && !absl::EndsWith(f.path, ".safetensors")) {
      small_files.insert(f.path);
    }
  }

  const nlohmann::json record = RunRecord(src.image(), options.policy, spec.layout);
  if (absl::Status o = OpenStaging(st, record, options.resume); !o.ok()) return o;
  if (options.resume) {
    if (absl::Status c = CheckStagingEntries(st, plan, small_files); !c.ok()) {
      st.tmp.Reset();
      return c;
    }
  }
  if (absl::Status o = OpenShards(st, plan, options.resume); !o.ok()) return st.Fail(o);

  // The second half: tensor data, streamed in the window. A fused group's unit scans it for
  // the policy and, while the source is transcodable, writes its derived tensors.
  TranscodeResult result;
  result.layout = spec.layout;
  std::vector<ScaleWindowPartial> parts(units->size());
  std::atomic<bool> refused{false};
  std::atomic<uint64_t> modules{0}, zero_groups{0};
  std::vector<StreamWork> work;
  auto need = [&](const std::string& name, StreamWork* w) {
    if (std::optional<TensorRef> t = src.Find(name)) w->tensors.push_back({t->file, t->info});
  };
  for (size_t i = 0; i < units->size(); ++i) {
    const ScaleWindowUnit& u = (*units)[i];
    StreamWork w{absl::StrCat("transcode ", u.fused_group), {}, {}};
    for (const std::string& t : u.tensors) need(t, &w);
    w.run = [&, i]() -> absl::Status {
      const ScaleWindowUnit& unit = (*units)[i];
      absl::StatusOr<ScaleWindowPartial> part = policy.Scan(src, unit);
      if (!part.ok()) return part.status();
      parts[i] = *part;
      const ScaleWindowResult r = policy.Finish({*std::move(part)});
      for (const TensorScaleStats& t : r.tensors) {
        if (t.kind != "mxfp4") {
          return absl::InvalidArgumentError(absl::StrCat(t.tensor, ": is ", t.kind, ", not MXFP4"));
        }
      }
      if (r.verdict != ScaleWindowVerdict::kLosslessTranscodable) refused = true;
      if (refused) return absl::OkStatus();  // the rest is scanned for the message only
      if (gpt_oss) {
        const std::string& base = unit.fused_group;
        absl::StatusOr<uint64_t> z =
            CastGptOss(src, *dims, base, *plan.shards[plan.module_shard.at(base)]);
        if (!z.ok()) return z.status();
        ++modules;
        zero_groups += *z;
        return absl::OkStatus();
      }
      for (const ScaleWindowUnit::Member& m : unit.members) {
        absl::StatusOr<QuantWeight> qw = ResolveWeight(src, m.name);
        if (!qw.ok()) return qw.status();
        // A fused group without any nonzero value gets global scale 1 (k_max = 8).
        absl::StatusOr<DerivedScales> d =
            DeriveScales(*qw, r.Find(m.name)->pair_k_max.value_or(8), spec);
        if (!d.ok()) return d.status();
        OutShard& out = *plan.shards[plan.module_shard.at(m.name)];
        absl::Status s = out.Put(m.name + spec.packed, src.Find(m.name + kPackedSuffix)->bytes());
        if (s.ok()) s = out.Put(m.name + kScaleSuffix, d->block_scales);
        if (s.ok()) s = out.Put(m.name + spec.global, F32Bytes(d->global_scale));
        if (!s.ok()) return s;
        ++modules;
        zero_groups += d->zero_groups;
      }
      return absl::OkStatus();
    };
    work.push_back(std::move(w));
  }
  // Tensors carried over unchanged are written as the cursor passes them, never held.
  std::vector<StreamSink> sinks;
  for (const Plan::Copy& c : plan.copies) {
    OutShard* out = plan.shards[c.shard].get();
    const uint64_t at = out->layout.offsets[out->index.at(c.info->name)];
    const uint64_t begin = c.file->data_start() + c.info->begin;
    sinks.push_back({c.file, begin, begin + c.info->num_bytes(),
                     [&refused, out, at, size = c.info->num_bytes()](
                         uint64_t offset, std::span<const uint8_t> bytes) -> absl::Status {
                       if (refused) return absl::OkStatus();
                       return out->Place(at + offset, bytes, offset + bytes.size() == size);
                     }});
  }
  Finisher finisher(std::max(1u, (options.threads == 0 ? DefaultThreads() : options.threads) / 4));
  for (auto& shard : plan.shards) {
    shard->on_complete = [&finisher, s = shard.get()] { finisher.Add(s); };
  }
  absl::StatusOr<StreamResult> streamed =
      StreamTrees({*image}, std::move(work), read, progress, std::move(sinks));
  if (!streamed.ok()) {
    // A source refused as not transcodable (INVALID_ARGUMENT, FAILED_PRECONDITION) would be
    // refused again: nothing for --resume to continue.
    st.remove_on_failure = streamed.status().code() == absl::StatusCode::kInvalidArgument ||
                           streamed.status().code() == absl::StatusCode::kFailedPrecondition;
    return st.Fail(streamed.status());
  }
  result.policy = policy.Finish(std::move(parts));
  if (result.policy.verdict != ScaleWindowVerdict::kLosslessTranscodable) {
    st.remove_on_failure = true;
    return st.Fail(absl::FailedPreconditionError(PolicyFailure(result.policy)));
  }
  result.source = streamed->images[0];
  result.bytes_read = streamed->bytes_read;
  result.peak_kept_bytes = streamed->peak_kept_bytes;
  result.modules_transcoded = modules;
  result.zero_groups_canonicalized = zero_groups;
  // CastToModelOpt writes +0 on all-zero groups (docs/quant.md "gpt-oss layouts").
  result.zero_group_scale = !gpt_oss && spec.zero_group_scale != 0 ? "1.0" : "+0";

  if (absl::Status s = finisher.Close(); !s.ok()) return st.Fail(s);
  // Shards whose bytes were all placed before the stream (no tensor data) finish here.
  absl::Status fin = ParallelFor(plan.shards.size(), options.threads, [&](size_t i) {
    return plan.shards[i]->finished ? absl::OkStatus() : plan.shards[i]->Finish();
  });
  if (!fin.ok()) return st.Fail(fin);
  auto output = std::make_shared<TreeImage>();
  output->root = absl::StrCat(st.parent_label, "/", st.dst_name);
  auto add_output = [&](const std::string& rel, uint64_t size, const Digest& d) {
    ImageFile f;
    f.path = rel;
    f.name = EncodeName(rel);
    f.identity.size = size;
    f.sha256 = d;
    output->files.push_back(std::move(f));
    result.files.push_back(rel);
  };
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (const auto& s : plan.shards) {
    if (s->existed) ++(s->differed ? result.shards_redone : result.shards_kept);
    for (const TensorEntry& t : s->layout.tensors) weight_map[t.name] = s->rel;
    result.tensors_written += s->layout.tensors.size();
    total_size += s->layout.file_size - s->layout.prefix.size();
    add_output(s->rel, s->layout.file_size, s->sha256);
  }
  result.bytes_written = total_size;

  nlohmann::json config = src.config();
  std::map<std::string, std::string> texts;
  if (spec.layout == TranscodeLayout::kModelOpt) {
    // One description, at the top level, as ModelOpt's exporter writes it; a text_config copy
    // would still describe the MXFP4 source (docs/formats.md §9).
    config["quantization_config"] = ModelOptQuantizationConfig(hf_quant_config);
    if (config.contains("text_config") && config["text_config"].is_object()) {
      config["text_config"].erase("quantization_config");
    }
    texts["hf_quant_config.json"] = DumpJson(hf_quant_config, 2);
  } else {
    if (config.contains("quantization_config")) {
      config["quantization_config"] = Nvfp4QuantizationConfig(config["quantization_config"]);
    }
    if (config.contains("text_config") && config["text_config"].contains("quantization_config")) {
      config["text_config"]["quantization_config"] =
          Nvfp4QuantizationConfig(config["text_config"]["quantization_config"]);
    }
  }
  texts["config.json"] = DumpJson(config, 2);
  if (src.layout() == CheckpointLayout::kSharded) {
    nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
    texts["model.safetensors.index.json"] = DumpJson(index, 2);
  }
  for (const std::string& name : small_files) {
    std::span<const uint8_t> bytes;
    if (auto it = texts.find(name); it != texts.end()) {
      bytes = AsBytes(it->second);
    } else {
      absl::StatusOr<std::span<const uint8_t>> kept = src.image().Content(name);
      if (!kept.ok()) return st.Fail(kept.status());
      bytes = *kept;
    }
    if (absl::Status w = WriteSmallFile(st.tmp.get(), st.tmp_label, name, bytes); !w.ok()) {
      return st.Fail(w);
    }
    add_output(name, bytes.size(), Sha256Of(bytes));
  }
  std::sort(output->files.begin(), output->files.end(),
            [](const ImageFile& a, const ImageFile& b) { return PosixPathLess(a.name, b.name); });
  // Every byte transcoded was read from files that still hold it; then publish.
  if (absl::Status u = result.source->CheckUnchanged(); !u.ok()) return st.Fail(u);
  if (::unlinkat(st.tmp.get(), kRunRecord, 0) != 0) {
    return st.Fail(absl::DataLossError(absl::StrCat(st.tmp_label, "/", kRunRecord, ": ", Errno())));
  }
  if (absl::Status f = Fsync(st.tmp.get(), st.tmp_label); !f.ok()) return st.Fail(f);
  if (::renameat2(st.parent.get(), st.tmp_name.c_str(), st.parent.get(), st.dst_name.c_str(),
                  RENAME_NOREPLACE) != 0) {
    return st.Fail(absl::DataLossError(
        absl::StrCat(output->root, ": cannot rename ", st.tmp_label, " into place: ", Errno())));
  }
  st.tmp.Reset();
  if (absl::Status f = Fsync(st.parent.get(), st.parent_label); !f.ok()) return f;
  result.output = std::move(output);
  return result;
}

}  // namespace ckpt::quant
