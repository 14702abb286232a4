#include "core/io/tree_stream.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/io/file_hashers.h"
#include "core/io/page_buffer.h"
#include "core/parallel.h"

namespace ckpt {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// A read chunk: small windows get small chunks, so that the scratch buffers stay small next
// to what they bound.
uint64_t ChunkFor(uint64_t window) {
  return std::clamp<uint64_t>(window / 16, kMinReadChunk, 8ull << 20);
}

// A cursor's step is read in pieces of this size, each hashed while the next one is read.
constexpr uint64_t kHashPiece = 1ull << 20;

// Tensor buffers are mapped from 64 KiB, or window / 8192: at most 8192 mappings at once.
uint64_t MapFrom(uint64_t window) { return std::max<uint64_t>(64ull << 10, window / 8192); }

// Freed tensor buffers kept for the next tensor of the same size: window / 8, at most 128 MiB.
uint64_t SpareFor(uint64_t window) { return std::min<uint64_t>(window / 8, 128ull << 20); }

// What each worker thread keeps between steps: its read chunk and the threads that hash beside
// its reads.
struct WorkerTools {
  std::unique_ptr<uint8_t[]> scratch;
  Relay hash;  // the pieces' file hashes and sinks, while the next pieces are read
  Relay pass;  // a tensor's own hash, beside the file's (a tensor read again later)
};

// One tensor some work needs, from its admission to when its buffer is freed.
struct Slot {
  size_t stream = 0;
  const TensorInfo* info = nullptr;
  uint64_t begin = 0, end = 0;  // absolute offsets in the file
  std::vector<size_t> work;     // the work items that need it, ascending
  size_t users = 0;             // of those, not yet run
  // Read ahead of the file's cursor once the cursor reaches this offset (the start of a larger
  // tensor of the same work item; docs/audit-engine.md, "Memory"); kNever: read in order only.
  uint64_t trigger = kNever;
  // Re-read at `trigger`, behind the cursor, which hashed it without keeping it ("Reading
  // behind the cursor", "Any tensor order"): `passed_digest` is the SHA-256 of what the cursor
  // hashed, and the bytes re-read must have it.
  bool revisit = false;
  uint64_t revisit_trigger = kNever;  // planning: the earliest anchor behind which it lies
  size_t revisit_votes = 0;           // planning: the work items for which it lies behind
  std::unique_ptr<Sha256> passing;    // the cursor's hash of it while it passes
  Digest passed_digest{};
  // Hashing behind the reads: the SHA-256 of the buffer the work read (taken by the worker
  // that runs the first item on it), and whether the hashing cursor has passed it
  // (passed_digest); whichever comes second compares them.
  bool claimed = false, fetched = false, hashed = false;
  Digest fetched_digest{};
  bool admitted = false;  // counted in the bytes the admitted work will need (need_, then kept_)
  bool granted = false;   // has had a buffer (counted in kept_ until freed)
  bool complete = false;  // every byte is in the buffer
  bool lent = false;      // lent to its SafetensorsFile
  bool passed = false;    // the cursor has hashed past it
  // Read ahead, and freed once its units have run, before the cursor passes it (PlanPassing:
  // `release`; `released` once freed so): the cursor reads it again, checked against the
  // digest of the bytes the units read.
  bool release = false, released = false;
  uint64_t filled = 0;    // bytes read ahead so far
  io::PageBuffer bytes;
  Digest digest{};  // of a skimmed file's slot, once complete
  // Lives (PlanPassing): the units of rank lives[i - 1] and later (up to lives[i]) read it in
  // its life i, again, once those of the lives before have run and freed it. `life` is the
  // current one (0: the first); life_users[i]: the units of life i that have not run.
  std::vector<size_t> lives;
  std::vector<size_t> life_users;
  size_t life = 0;
  size_t first = 0;  // the admission rank (RankWork) of the first work item that needs it
  uint64_t size() const { return end - begin; }
  size_t LifeOf(size_t rank) const {
    return std::upper_bound(lives.begin(), lives.end(), rank) - lives.begin();
  }
  size_t key() const { return life == 0 ? first : lives[life - 1]; }  // its life's first unit
};

// The unread rest of one deferred file.
struct FileStream {
  ImageFile* out = nullptr;  // in the completed image
  TreeImage* image = nullptr;
  size_t image_index = 0;  // in StreamTrees' input
  std::string label;
  uint64_t pos = 0, size = 0;  // the cursor: every byte before it is hashed
  std::vector<size_t> slots;   // by offset
  size_t next = 0;             // first slot the cursor has not passed
  std::vector<size_t> ahead;   // slots with a trigger, by trigger
  size_t armed_next = 0;       // ahead[0, armed_next) have had their trigger reached
  std::set<std::pair<size_t, size_t>> armed;  // (key, slot): may be read ahead now
  size_t reading_ahead = kNone;               // the slot a read-ahead is filling
  size_t revisits_left = 0;  // revisit slots not yet re-read: the file stays open for them
  // The end is checked and the digests taken (DoStep cleared stream_from; set by the thread
  // that did that step, under the lock).
  bool closed = false;
  // Admission (Streamer::Admit): every slot before path_end (slots[0, path_next)) is admitted.
  uint64_t path_end = 0;
  size_t path_next = 0;
  uint64_t storage_bytes = 0;  // read from storage by this stream
  // A step of the cursor and one read ahead (or behind) may run at once, on two threads, once
  // the first step has opened the file and its hashers (`opened`); until then a step runs alone.
  bool busy = false, ahead_busy = false, opened = false, done = false;
  bool skim = false;  // not hashed: the cursor skips what no work needs (SkimFiles)
  // ReadOptions::hash_behind: the cursor reads only what work needs, without hashing; the
  // hashing cursor (hash_pos) follows it, never ahead of it, and completes the file.
  bool hash_behind = false;
  uint64_t hash_pos = 0;
  size_t hash_next = 0;  // first slot the hashing cursor has not passed
  bool hash_busy = false;
  std::vector<StreamSink> sinks;  // by offset
  // Touched only by the thread that hashes the file: the one holding `busy`, or behind the
  // reads the one holding `hash_busy`.
  size_t sink_next = 0;  // sinks before it lie before the hashing cursor
  std::unique_ptr<io::RandomAccessFile> file;
  std::unique_ptr<io_internal::FileHashers> hashers;
};

struct Item {
  std::vector<size_t> slots;
  size_t missing = 0;              // slots not yet complete
  size_t waiting = 0;              // items of its `after` not yet run or dropped
  std::vector<size_t> dependents;  // items whose `after` names this one
  bool decided = false;            // `after` done and `wanted` (if any) has answered
  bool dropped = false;            // `wanted` said no: never runs, holds nothing
  bool queued = false;             // put in ready_
  bool done = false;               // ran or dropped
};

// One step on a stream, decided under the lock and done outside it.
struct Step {
  enum class Kind {
    kRead,       // read at the cursor and hash (into a slot's buffer, or the thread's scratch)
    kHashKept,   // hash at the cursor from a slot read ahead: no storage read
    kReadAhead,  // read a slot's bytes ahead of the cursor: hashed later, from the buffer
    kSkip,       // move the cursor past bytes it need not read (skimmed file, hash_behind)
    kHash,       // hash_behind: read behind the cursor (from the page cache) and hash
    kClose,      // after the cursor's last step and every read behind it: check the file's end
  };
  Kind kind = Kind::kRead;
  size_t stream = 0;
  size_t slot = kNone;
  uint64_t offset = 0, length = 0;
  uint8_t* into = nullptr;  // kRead/kReadAhead: where the bytes go (null: scratch); kHashKept: from
};

class Streamer {
 public:
  Streamer(const ReadOptions& options, Progress& progress)
      : options_(options),
        progress_(progress),
        chunk_(ChunkFor(options.memory_window)),
        pool_(SpareFor(options.memory_window), MapFrom(options.memory_window)) {}

  ~Streamer() {
    for (Slot& s : slots_) {
      if (s.lent) File(s).Reclaim(*s.info);
    }
  }

  absl::StatusOr<StreamResult> Run(const std::vector<std::shared_ptr<const TreeImage>>& images,
                                   std::vector<StreamWork> work, std::vector<StreamSink> sinks,
                                   const SkimFiles& skim) {
    work_ = std::move(work);
    for (const auto& image : images) {
      auto copy = std::make_shared<TreeImage>(*image);
      kept_ += copy->kept_bytes;
      for (ImageFile& f : copy->files) {
        if (!f.stream_from) continue;
        FileStream s;
        s.out = &f;
        s.image = copy.get();
        s.image_index = out_.size();
        s.label = absl::StrCat(copy->root, "/", f.path);
        s.pos = *f.stream_from;
        s.size = f.size();
        s.path_end = s.pos;
        s.skim = skim && skim(out_.size(), f);
        s.hash_behind = options_.hash_behind && !s.skim;
        s.hash_pos = s.pos;
        if (f.safetensors != nullptr) by_file_[f.safetensors.get()] = streams_.size();
        streams_.push_back(std::move(s));
      }
      out_.push_back(std::move(copy));
    }
    if (kept_ > options_.memory_window) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the audit keeps ", kept_, " bytes of small files and headers, over the memory window of ",
          options_.memory_window, " bytes (raise it with --memory-window)"));
    }
    peak_ = kept_;
    for (StreamSink& sink : sinks) {
      auto it = by_file_.find(sink.file);
      if (it == by_file_.end() || sink.begin < streams_[it->second].pos) {
        return absl::InvalidArgumentError("a stream sink lies outside the streamed bytes");
      }
      if (streams_[it->second].skim) {
        return absl::InvalidArgumentError("a stream sink lies in a file that is not hashed");
      }
      streams_[it->second].sinks.push_back(std::move(sink));
    }
    for (FileStream& s : streams_) {
      std::sort(s.sinks.begin(), s.sinks.end(),
                [](const StreamSink& a, const StreamSink& b) { return a.begin < b.begin; });
    }
    if (absl::Status s = Plan(); !s.ok()) return s;
    uint64_t total = 0;
    for (const FileStream& s : streams_) total += s.size - s.pos;
    progress_.Begin("read", total);
    const unsigned threads = options_.threads ? options_.threads : DefaultThreads();
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back([this] { Worker(); });
    Worker();
    for (std::thread& t : pool) t.join();
    progress_.End();
    if (!error_.ok()) return error_;
    for (size_t w = 0; w < items_.size(); ++w) {
      if (!items_[w].done) {
        return absl::InternalError(absl::StrCat(work_[w].label, ": never ran"));
      }
    }
    StreamResult result;
    result.bytes_read = bytes_read_;
    result.peak_kept_bytes = peak_;
    result.reread_bytes = reread_bytes_;
    result.reread_tensors = reread_tensors_;
    for (const FileStream& s : streams_) s.image->bytes_read += s.storage_bytes;
    for (const FileStream& s : streams_) {
      if (!s.skim) continue;
      for (size_t j : s.slots) {
        const Slot& slot = slots_[j];
        if (!slot.complete) continue;  // only dropped work needed it: never read
        result.ranges.push_back({s.image_index, s.out->name, slot.info->name, slot.begin,
                                 slot.end, slot.size() == 0 ? Sha256Of({}) : slot.digest});
      }
    }
    for (auto& image : out_) {
      for (const ImageFile& f : image->files) {
        if (f.stream_from) return absl::InternalError(absl::StrCat(f.path, ": not streamed"));
      }
      result.images.push_back(std::move(image));
    }
    return result;
  }

 private:
  const SafetensorsFile& File(const Slot& s) const { return *streams_[s.stream].out->safetensors; }

  // Slots for every tensor of a deferred file that some work needs; which of them are read
  // ahead; items with all their tensors already in memory are ready at once.
  absl::Status Plan() {
    std::map<std::pair<size_t, const TensorInfo*>, size_t> slot_of;
    items_.resize(work_.size());
    for (size_t w = 0; w < work_.size(); ++w) {
      for (size_t a : work_[w].after) {
        if (a >= w) {
          return absl::InvalidArgumentError(absl::StrCat(
              work_[w].label, ": depends on work item ", a, ", which does not come before it"));
        }
        items_[a].dependents.push_back(w);
        ++items_[w].waiting;
      }
      uint64_t need = 0;
      for (const auto& [file, info] : work_[w].tensors) {
        auto it = by_file_.find(file);
        if (it == by_file_.end()) continue;  // a file kept whole
        auto [pos, fresh] = slot_of.emplace(std::make_pair(it->second, info), slots_.size());
        if (fresh) {
          Slot s;
          s.stream = it->second;
          s.info = info;
          s.begin = file->data_start() + info->begin;
          s.end = file->data_start() + info->end;
          slots_.push_back(std::move(s));
          streams_[it->second].slots.push_back(pos->second);
        }
        Slot& s = slots_[pos->second];
        if (!s.work.empty() && s.work.back() == w) continue;  // named twice by one item
        s.work.push_back(w);
        ++s.users;
        items_[w].slots.push_back(pos->second);
        need += s.size();
      }
      items_[w].missing = items_[w].slots.size();
      if (kept_ + need > options_.memory_window) {
        return absl::ResourceExhaustedError(absl::StrCat(
            work_[w].label, " needs ", need, " bytes of tensors in memory at once; with the ",
            kept_, " bytes of small files and headers that is over the memory window of ",
            options_.memory_window, " bytes (raise it with --memory-window)"));
      }
      PlanReadAhead(w);
    }
    PlanRevisits();
    for (FileStream& s : streams_) {
      std::sort(s.slots.begin(), s.slots.end(),
                [&](size_t a, size_t b) { return slots_[a].begin < slots_[b].begin; });
    }
    RankWork();
    PlanPassing();
    for (FileStream& s : streams_) {
      for (size_t j : s.slots) {
        if (slots_[j].trigger != kNever) s.ahead.push_back(j);
      }
      std::sort(s.ahead.begin(), s.ahead.end(),
                [&](size_t a, size_t b) { return slots_[a].trigger < slots_[b].trigger; });
      Arm(s);
    }
    for (size_t w = 0; w < items_.size(); ++w) {
      if (items_[w].waiting == 0) Decide(w);
    }
    return absl::OkStatus();
  }

  // The admission order: by where a work item's tensors lie, so that it follows the files'
  // cursors rather than names: the first input image that holds any of its tensors, then the
  // last file there (files in image order) and the offset its cursor must reach there (the end
  // of its furthest tensor read in order, or the trigger of one read ahead); the list order
  // breaks ties. Work on files kept whole comes first. Dependent work comes after the work it
  // waits for (which is admitted first and can always complete), so that whatever is admitted
  // can run once its tensors are in, and a unit's tensors are freed by the time the units
  // ranked after it are admitted: what PlanPassing counts on.
  void RankWork() {
    std::vector<std::tuple<size_t, size_t, uint64_t>> rank(items_.size(), {0, 0, 0});
    for (size_t w = 0; w < items_.size(); ++w) {
      if (items_[w].slots.empty()) continue;
      size_t image = kNone;
      for (size_t j : items_[w].slots) {
        image = std::min(image, streams_[slots_[j].stream].image_index);
      }
      for (size_t j : items_[w].slots) {
        const Slot& s = slots_[j];
        if (streams_[s.stream].image_index != image) continue;
        rank[w] = std::max(rank[w], std::make_tuple(image, s.stream, Reach(s)));
      }
    }
    for (size_t w = 0; w < items_.size(); ++w) {
      for (size_t a : work_[w].after) rank[w] = std::max(rank[w], rank[a]);
    }
    order_.resize(items_.size());
    for (size_t w = 0; w < items_.size(); ++w) order_[w] = w;
    std::stable_sort(order_.begin(), order_.end(),
                     [&](size_t a, size_t b) { return rank[a] < rank[b]; });
    rank_.resize(items_.size());
    for (size_t r = 0; r < order_.size(); ++r) rank_[order_[r]] = r;
    for (Slot& s : slots_) s.first = NextUser(s, 0);
  }

  // Any tensor order (docs/audit-engine.md): admission replayed on the headers alone. When
  // admitting the unit of rank r would need more than the window even once every unit before
  // it has run (the tensors the cursors hold for later units, its own, and what its cursors
  // must pass to reach them), the held tensors whose next unit comes latest stop being held,
  // until it fits. One no unit has read yet is passed: the cursor hashes it without keeping it,
  // and it is read again, checked against that hash, once its first unit is admitted. One that
  // earlier units have read (and that later units need again: a layer's forward after the
  // checks of its experts) is freed once those have run, and read again, checked against the
  // hash of the bytes they read, once its next unit is admitted: a second life (Relive), once
  // per tensor. Kept: a tensor in a file that is not hashed, one read ahead that the cursors
  // are not yet admitted to pass once units have read it, and behind the reads
  // (ReadOptions::hash_behind) one units have read. Depends only on the headers and the window,
  // so the stream admits exactly what this replay admits, in the same order.
  void PlanPassing() {
    // held: (rank of the next unit to run on it, slot) for each admitted slot not yet freed.
    std::set<std::pair<size_t, size_t>> held, passable;
    std::vector<size_t> key(slots_.size(), kNone);
    std::vector<size_t> waiting;  // read ahead, every unit done: freed once the cursor passes
    std::vector<std::pair<bool, uint64_t>> first_life(slots_.size());  // revisit, trigger
    uint64_t held_bytes = 0;
    auto hold = [&](size_t j, size_t next) {
      const Slot& s = slots_[j];
      key[j] = next;
      held.insert({next, j});
      const FileStream& f = streams_[s.stream];
      if (s.size() == 0) return;
      // A skimmed file's tensor passed is read once, later; its lives would need the digest of
      // each read compared, which only hashed files have.
      if (next == s.first || !(f.hash_behind || f.skim)) passable.insert({next, j});
    };
    // A slot read ahead is freed only once the cursor has passed it (Relive waits for that):
    // the cursors must be admitted past it before unit r is, which needs the memory.
    std::vector<uint64_t> path_before(streams_.size());
    auto may_pass = [&](const Slot& s, size_t next) {
      return next == s.first || s.trigger == kNever || s.revisit || path_before[s.stream] >= s.end;
    };
    auto unhold = [&](size_t j) {
      if (key[j] == kNone) return;
      held.erase({key[j], j});
      passable.erase({key[j], j});
      key[j] = kNone;
    };
    std::vector<size_t> fresh;
    for (size_t r = 0; r < order_.size(); ++r) {
      for (size_t i = 0; i < streams_.size(); ++i) path_before[i] = streams_[i].path_end;
      fresh.clear();
      Admit(order_[r], /*apply=*/true, nullptr, &fresh);
      for (size_t j : fresh) {
        held_bytes += slots_[j].size();
        hold(j, NextUser(slots_[j], r));
      }
      // What the window cannot hold goes: first tensors read ahead and done with that wait for
      // the cursor (released: the cursor reads them again), then held ones, latest first.
      std::erase_if(waiting, [&](size_t j) {
        const FileStream& f = streams_[slots_[j].stream];
        if (kept_ + held_bytes <= options_.memory_window || f.hash_behind) return false;
        slots_[j].release = true;
        held_bytes -= slots_[j].size();
        return true;
      });
      for (auto it = passable.end();
           kept_ + held_bytes > options_.memory_window && it != passable.begin();) {
        const auto cur = std::prev(it);
        if (cur->first <= r) break;
        const auto [next, j] = *cur;
        Slot& s = slots_[j];
        if (!may_pass(s, next)) {
          it = cur;
          continue;
        }
        unhold(j);  // erases *cur; `it` stays valid
        held_bytes -= s.size();
        s.admitted = false;
        ++streams_[s.stream].revisits_left;
        if (next == s.first) {
          s.revisit = true;  // passed
          s.trigger = s.end;
        } else {
          if (s.lives.empty()) first_life[j] = {s.revisit, s.trigger};
          s.lives.push_back(next);  // freed once the units before `next` have run
          s.revisit = true;         // from then on, as the replay goes
          s.trigger = s.end;
        }
      }
      // Unit r has run: each of its tensors waits for its next unit, or is freed (one read
      // ahead stays until the cursor has passed it).
      for (size_t j : items_[order_[r]].slots) {
        if (key[j] != r) continue;
        unhold(j);
        if (const size_t next = NextUser(slots_[j], r + 1); next != kNone) {
          hold(j, next);
        } else if (slots_[j].trigger != kNever && !slots_[j].revisit &&
                   streams_[slots_[j].stream].path_end < slots_[j].end) {
          waiting.push_back(j);
        } else {
          held_bytes -= slots_[j].size();
        }
      }
      std::erase_if(waiting, [&](size_t j) {
        if (streams_[slots_[j].stream].path_end < slots_[j].end) return false;
        held_bytes -= slots_[j].size();
        return true;
      });
    }
    for (size_t j = 0; j < slots_.size(); ++j) {
      Slot& s = slots_[j];
      s.admitted = false;
      if (s.lives.empty()) continue;
      std::tie(s.revisit, s.trigger) = first_life[j];
      s.life_users.assign(s.lives.size() + 1, 0);
      for (size_t w : s.work) ++s.life_users[s.LifeOf(rank_[w])];
    }
    for (FileStream& f : streams_) {
      f.path_end = f.pos;
      f.path_next = 0;
    }
    need_ = 0;
  }

  // The rank of the first unit at rank `from` or later that needs the slot; kNone if none.
  size_t NextUser(const Slot& s, size_t from) const {
    size_t next = kNone;
    for (size_t w : s.work) {
      if (rank_[w] >= from) next = std::min(next, rank_[w]);
    }
    return next;
  }

  // The read-ahead rule: in each file, a work item's largest tensor (the anchor, read in
  // order) and its other tensors that lie beyond the anchor, not adjacent to it, when together
  // they are smaller than the anchor: those are read ahead when the cursor reaches the anchor,
  // so the item runs as soon as the anchor is in and holding the partners until the cursor
  // passes them costs less than holding the anchor until it reaches them. An item's own
  // read_ahead_from replaces the rule in the files it names.
  void PlanReadAhead(size_t w) {
    std::map<size_t, uint64_t> from;  // stream -> offset
    for (const auto& [file, info] : work_[w].read_ahead_from) {
      auto it = by_file_.find(file);
      if (it == by_file_.end()) continue;
      const uint64_t at = file->data_start() + info->begin;
      auto [pos, fresh] = from.emplace(it->second, at);
      if (!fresh) pos->second = std::min(pos->second, at);
    }
    std::map<size_t, std::vector<size_t>> by_stream;
    for (size_t j : items_[w].slots) by_stream[slots_[j].stream].push_back(j);
    for (const auto& [stream, js] : by_stream) {
      if (auto f = from.find(stream); f != from.end()) {
        for (size_t j : js) {
          if (slots_[j].begin > f->second) {
            slots_[j].trigger = std::min(slots_[j].trigger, f->second);
          }
        }
        continue;
      }
      size_t anchor = js.front();
      for (size_t j : js) {
        const Slot& a = slots_[anchor];
        const Slot& s = slots_[j];
        if (s.size() > a.size() || (s.size() == a.size() && s.begin < a.begin)) anchor = j;
      }
      const Slot& a = slots_[anchor];
      bool beyond = js.size() > 1;
      uint64_t partners = 0;
      for (size_t j : js) {
        if (j == anchor) continue;
        beyond = beyond && slots_[j].begin > a.end;  // not before the anchor, nor adjacent
        partners += slots_[j].size();
      }
      // The mirror image, for reading behind the cursor: the partners that lie before the
      // anchor, not adjacent to it, when together they are smaller than it (an NVFP4 module's
      // scales when the shard stores every scale before every packed weight).
      std::vector<size_t> behind;
      uint64_t behind_bytes = 0;
      for (size_t j : js) {
        if (j == anchor || slots_[j].end >= a.begin || slots_[j].size() == 0) continue;
        behind.push_back(j);
        behind_bytes += slots_[j].size();
      }
      if (behind_bytes < a.size()) {
        for (size_t j : behind) {
          ++slots_[j].revisit_votes;
          slots_[j].revisit_trigger = std::min(slots_[j].revisit_trigger, a.begin);
        }
      }
      if (!beyond || partners >= a.size()) continue;
      for (size_t j : js) {
        if (j != anchor) slots_[j].trigger = std::min(slots_[j].trigger, a.begin);
      }
    }
  }

  // The rule for reading behind the cursor: in a file where the partners that lie behind their
  // anchors (for every work item that needs them, and not read ahead for any) would together
  // take more than half the window while the cursor held them until their anchors, they are
  // not held: the cursor hashes them as it passes, and each is read again when the cursor
  // reaches its anchor and checked against that hash. Below that, holding them costs no second
  // read. Depends only on the headers and the window.
  void PlanRevisits() {
    std::vector<uint64_t> behind(streams_.size(), 0);
    auto candidate = [this](const Slot& s) {
      return s.revisit_votes == s.work.size() && s.trigger == kNever && !streams_[s.stream].skim;
    };
    for (const Slot& s : slots_) {
      if (candidate(s)) behind[s.stream] += s.size();
    }
    for (Slot& s : slots_) {
      if (!candidate(s) || behind[s.stream] <= options_.memory_window / 2) continue;
      s.revisit = true;
      s.trigger = s.revisit_trigger;
      ++streams_[s.stream].revisits_left;
    }
  }

  // Under the lock: the read-ahead slots whose trigger the cursor has reached may now be read
  // ahead; those the cursor has reached are read in order instead.
  void Arm(FileStream& s) {
    while (s.armed_next < s.ahead.size() && slots_[s.ahead[s.armed_next]].trigger <= s.pos) {
      const size_t j = s.ahead[s.armed_next++];
      const Slot& slot = slots_[j];
      if (!slot.granted && !Unneeded(slot) && (slot.revisit || slot.begin > s.pos)) {
        s.armed.insert({slot.key(), j});
      }
    }
    for (auto it = s.armed.begin(); it != s.armed.end();) {
      const Slot& slot = slots_[it->second];
      it = !slot.revisit && slot.begin <= s.pos ? s.armed.erase(it) : std::next(it);
    }
  }

  // Every item that needed the slot was dropped before it got memory: the cursor hashes it
  // from scratch.
  static bool Unneeded(const Slot& s) { return s.users == 0 && !s.granted; }

  // How far the cursor must go for a slot: its end, or for one read ahead, its trigger.
  static uint64_t Reach(const Slot& s) { return s.trigger != kNever ? s.trigger : s.end; }

  // Admission: work items are admitted in order (RankWork), and a tensor gets memory only once
  // an item that needs it (or whose file must be read past it) is admitted. Admitting item k
  // adds what k needs that the items admitted before it did not: in each of k's files, every
  // needed tensor from the end of what is counted up to k's Reach there (the cursor holds each
  // needed tensor it passes), and k's tensors read ahead beyond that. `apply` false: only the
  // cost. `far`: k's furthest tensor not yet admitted, for messages.
  uint64_t Admit(size_t k, bool apply, const Slot** far = nullptr,
                 std::vector<size_t>* admitted = nullptr) {
    std::vector<std::pair<size_t, uint64_t>> reach;  // stream, path end
    auto reach_of = [&](size_t stream) {
      return std::find_if(reach.begin(), reach.end(), [&](auto& p) { return p.first == stream; });
    };
    for (size_t j : items_[k].slots) {
      const Slot& s = slots_[j];
      const uint64_t r = Reach(s);
      auto it = reach_of(s.stream);
      if (it == reach.end()) {
        reach.push_back({s.stream, std::max(streams_[s.stream].path_end, r)});
      } else {
        it->second = std::max(it->second, r);
      }
      if (far != nullptr && !s.admitted && (*far == nullptr || (*far)->end < s.end)) *far = &s;
    }
    uint64_t cost = 0;
    for (const auto& [stream, end] : reach) {
      FileStream& f = streams_[stream];
      size_t i = f.path_next;
      for (; i < f.slots.size() && slots_[f.slots[i]].begin < end; ++i) {
        Slot& s = slots_[f.slots[i]];
        if (s.admitted || s.revisit || Unneeded(s)) continue;  // the cursor holds neither
        cost += s.size();
        if (apply) s.admitted = true;
        if (admitted != nullptr) admitted->push_back(f.slots[i]);
      }
      if (apply) {
        f.path_end = end;
        f.path_next = i;
      }
    }
    for (size_t j : items_[k].slots) {
      Slot& s = slots_[j];
      if (s.admitted) continue;
      if (!apply && !s.revisit && s.begin < reach_of(s.stream)->second) continue;  // on the path
      cost += s.size();
      if (apply) s.admitted = true;
      if (admitted != nullptr) admitted->push_back(j);
    }
    if (apply) need_ += cost;
    return cost;
  }

  // The next item to admit must wait for the work it depends on to say whether it is wanted.
  bool Undecided(size_t k) const {
    return work_[k].wanted && !items_[k].decided && !items_[k].slots.empty();
  }

  // The next item to admit reads a tensor again in its second life, which has not begun: the
  // units before it that read it have not all run.
  bool AwaitsRelive(size_t k) const {
    for (size_t j : items_[k].slots) {
      const Slot& s = slots_[j];
      if (s.LifeOf(rank_[k]) > s.life) return true;
    }
    return false;
  }

  // Admits items in order until `slot` is admitted, while what the admitted work needs fits in
  // the window besides what is held. False when the next item does not fit now, or waits for
  // the work it depends on. Dropped items are skipped.
  bool AdmitFor(const Slot& slot) {
    while (!slot.admitted && admitted_ < items_.size()) {
      if (items_[order_[admitted_]].dropped) {
        ++admitted_;
        next_cost_.reset();
        continue;
      }
      if (Undecided(order_[admitted_]) || AwaitsRelive(order_[admitted_])) return false;
      if (!next_cost_) next_cost_ = Admit(order_[admitted_], /*apply=*/false);
      if (kept_ + need_ + *next_cost_ > options_.memory_window) return false;
      Admit(order_[admitted_++], /*apply=*/true);
      next_cost_.reset();
    }
    return slot.admitted;
  }

  void Grant(Slot& slot) {
    slot.granted = true;
    slot.bytes = pool_.Take(slot.size());
    need_ -= slot.size();
    kept_ += slot.size();
    peak_ = std::max(peak_, kept_);
  }

  void Free(Slot& slot) {
    kept_ -= slot.size();
    pool_.Give(std::move(slot.bytes));
  }

  void Lend(Slot& slot) {
    slot.complete = true;
    if (slot.users == 0) return;  // every item that needed it was dropped while it was read
    slot.lent = true;
    File(slot).Lend(*slot.info, slot.bytes.get());
    for (size_t w : slot.work) {
      if (slot.LifeOf(rank_[w]) != slot.life) continue;  // it reads another life
      if (--items_[w].missing == 0) MaybeReady(w);
    }
  }

  void MaybeReady(size_t w) {
    Item& item = items_[w];
    if (item.queued || item.dropped || !item.decided || item.missing > 0 || item.waiting > 0) {
      return;
    }
    item.queued = true;
    ready_.push_back(w);
  }

  // Every item of w's `after` is done: ask `wanted`.
  void Decide(size_t w) {
    if (items_[w].decided) return;
    items_[w].decided = true;
    if (work_[w].wanted && !work_[w].wanted()) {
      items_[w].dropped = true;
      for (size_t i : items_[w].slots) Unuse(i, w);
      Done(w);
      return;
    }
    MaybeReady(w);
  }

  // w ran or was dropped: the items that wait for it may now be decided.
  void Done(size_t w) {
    items_[w].done = true;
    for (size_t d : items_[w].dependents) {
      if (--items_[d].waiting == 0) Decide(d);
    }
  }

  // One item that needed the slot ran or was dropped: free what nobody needs any more (a tensor
  // read ahead stays until the cursor has hashed it).
  void Unuse(size_t i, size_t w) {
    Slot& slot = slots_[i];
    if (!slot.lives.empty()) --slot.life_users[slot.LifeOf(rank_[w])];
    if (--slot.users > 0) {
      Relive(i);
      return;
    }
    // Its later lives' units were all dropped: they read it no more.
    FileStream& s = streams_[slot.stream];
    s.revisits_left -= slot.lives.size() - slot.life;
    if (!slot.granted) {  // never got memory: no longer counted, never read ahead (or again)
      if (slot.admitted) need_ -= slot.size();
      s.armed.erase({slot.key(), i});
      if (slot.revisit) --s.revisits_left;
      MaybeClose(s);
      return;
    }
    MaybeClose(s);
    if (slot.lent) {
      File(slot).Reclaim(*slot.info);
      slot.lent = false;
    }
    if (slot.passed) {
      Free(slot);
    } else if (slot.release && slot.complete && s.pos < slot.begin) {
      Release(slot);
    }
  }

  // Under the lock: a slot read ahead whose units have all run, before the cursor has reached
  // it (so no step reads its buffer): freed now; the cursor reads it again as it passes, and
  // that must have the SHA-256 of the bytes the units read (a skimmed file's cursor skips it:
  // its range digest is of the bytes the units read).
  void Release(Slot& slot) {
    if (!slot.fetched && !streams_[slot.stream].skim) {  // no unit ran on it: all dropped
      slot.fetched_digest = Sha256Of(std::span<const uint8_t>(slot.bytes.get(), slot.size()));
    }
    Free(slot);
    slot.granted = false;
    slot.released = true;
  }

  // Under the lock: the units of a slot's life have all run (or were dropped) and only those of
  // later lives need it: the next life with units begins. Its buffer is freed, and it is read
  // again, behind the cursor, once that life's first unit is admitted, and must then have the
  // SHA-256 of the bytes the units before read (so the bytes the file digest covers). A slot
  // that got no memory in its life is read in order, or at its trigger, for the next.
  void Relive(size_t i) {
    Slot& slot = slots_[i];
    if (slot.life == slot.lives.size() || slot.users == 0 || slot.life_users[slot.life] > 0) {
      return;
    }
    if (slot.granted && (!slot.passed || !slot.complete)) return;  // the cursor, or its re-read
    FileStream& s = streams_[slot.stream];
    const size_t old_key = slot.key();
    size_t next = slot.life + 1;
    while (slot.life_users[next] == 0) ++next;  // one has units: users > 0
    s.revisits_left -= next - slot.life;        // the lives skipped, and this one's re-read below
    slot.life = next;
    if (!slot.granted) {  // read as before (re-keyed if armed): ahead, behind, or in order
      if (s.armed.erase({old_key, i}) > 0) s.armed.insert({slot.key(), i});
      MaybeClose(s);
      return;
    }
    ++s.revisits_left;      // read again for the next life
    if (!slot.revisit) {    // read in order: the digest of the bytes its units read
      if (!slot.fetched) {  // no unit ran on it: each one was dropped
        slot.fetched_digest = Sha256Of(std::span<const uint8_t>(slot.bytes.get(), slot.size()));
      }
      slot.passed_digest = slot.fetched_digest;
    }
    if (slot.lent) {
      File(slot).Reclaim(*slot.info);
      slot.lent = false;
    }
    Free(slot);
    slot.granted = slot.complete = slot.admitted = false;
    slot.filled = 0;
    slot.revisit = true;
    slot.trigger = slot.end;
    s.armed.insert({slot.key(), i});
  }

  void Fail(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }

  bool Finished() const {
    if (!ready_.empty() || running_ > 0) return false;
    return std::all_of(streams_.begin(), streams_.end(), [](const FileStream& s) { return s.done; });
  }

  // Streams whose next step needs no admission go first, then by the earliest work item the
  // tensor they would take memory for serves.
  size_t KeyOf(const FileStream& s) const {
    if (s.reading_ahead != kNone) return 0;
    size_t key = kNone;
    if (!s.armed.empty()) {
      if (slots_[s.armed.begin()->second].admitted) return 0;
      key = s.armed.begin()->first;
    }
    if (s.next < s.slots.size()) {
      const Slot& n = slots_[s.slots[s.next]];
      if (s.pos < n.begin || n.granted || n.admitted || n.revisit || Unneeded(n)) return 0;
      key = std::min(key, n.key());
    }
    return key == kNone ? 0 : key + 1;
  }

  // Until the first step has opened the file, a step runs alone.
  static bool Quiet(const FileStream& s) { return !s.busy && !s.ahead_busy && !s.hash_busy; }
  static bool CursorFree(const FileStream& s) { return !s.busy && (s.opened || Quiet(s)); }
  static bool AheadFree(const FileStream& s) { return !s.ahead_busy && (s.opened || Quiet(s)); }
  static bool HashFree(const FileStream& s) {
    return s.hash_behind && !s.hash_busy && !s.closed && (s.opened || Quiet(s));
  }

  // The hashing cursor's next step (hash_behind): inside one slot or between two, never past
  // the cursor. Its last step closes the file: not while a slot still has to be read again, nor
  // before the cursor has passed every slot (one of no bytes at the end of a file whose stream
  // starts there is passed by the cursor's step of no bytes, which lends it).
  bool HashStep(FileStream& s, Step* step) {
    while (s.hash_next < s.slots.size() && slots_[s.slots[s.hash_next]].end <= s.hash_pos) {
      ++s.hash_next;
    }
    Step h;
    h.kind = Step::Kind::kHash;
    h.stream = step->stream;
    h.offset = s.hash_pos;
    uint64_t until = s.size;
    if (s.hash_next < s.slots.size()) {
      const Slot& slot = slots_[s.slots[s.hash_next]];
      if (s.hash_pos >= slot.begin) h.slot = s.slots[s.hash_next];
      until = s.hash_pos >= slot.begin ? slot.end : slot.begin;
    }
    h.length = std::min(chunk_, std::min(until, s.pos) - s.hash_pos);
    if (h.length == 0 && s.hash_pos < s.size) return false;  // up with the cursor
    if (s.hash_pos + h.length == s.size && (s.revisits_left > 0 || s.next < s.slots.size())) {
      return false;
    }
    *step = h;
    return true;
  }

  // Picks the next step: a read-ahead in progress, then a read-ahead whose trigger the cursor
  // has reached, then the cursor, which runs beside a read-ahead of its file but never enters
  // the tensor being read ahead. False when no stream can move without more memory.
  bool PickStep(Step* step) {
    std::vector<size_t> order;
    for (size_t i = 0; i < streams_.size(); ++i) {
      const FileStream& s = streams_[i];
      if (!s.done && (CursorFree(s) || AheadFree(s) || HashFree(s))) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return KeyOf(streams_[a]) < KeyOf(streams_[b]); });
    for (size_t i : order) {
      FileStream& s = streams_[i];
      *step = Step{};
      step->stream = i;
      if (HashFree(s) && HashStep(s, step)) return true;
      const bool ahead_free = AheadFree(s);
      if (ahead_free && s.reading_ahead == kNone && !s.armed.empty()) {
        const size_t j = s.armed.begin()->second;
        if (AdmitFor(slots_[j])) {
          s.armed.erase(s.armed.begin());
          Grant(slots_[j]);
          s.reading_ahead = j;
        }
      }
      if (ahead_free && s.reading_ahead != kNone) {
        Slot& slot = slots_[s.reading_ahead];
        step->kind = Step::Kind::kReadAhead;
        step->slot = s.reading_ahead;
        step->offset = slot.begin + slot.filled;
        step->length = std::min(chunk_, slot.size() - slot.filled);
        step->into = slot.bytes.get() + slot.filled;
        return true;
      }
      if (!CursorFree(s) || s.closed) continue;
      if (s.pos == s.size && s.next == s.slots.size()) {
        // The hashing cursor completes the file, or the end is checked once every tensor to
        // be read again has been: a change before then is named by its tensor.
        if (s.hash_behind || s.revisits_left > 0 || s.reading_ahead != kNone) continue;
        step->kind = Step::Kind::kClose;
        step->offset = s.size;
        return true;
      }
      step->offset = s.pos;
      if (s.next < s.slots.size() && s.pos >= slots_[s.slots[s.next]].begin) {
        if (s.slots[s.next] == s.reading_ahead) continue;  // its bytes are still being read
        Slot& slot = slots_[s.slots[s.next]];
        step->slot = s.slots[s.next];
        step->length = std::min(chunk_, slot.end - s.pos);
        // A slot no admitted work needs, or one read again at its trigger, is hashed through
        // the scratch chunk; a skimmed file (which the cursor does not hash) and a file hashed
        // behind the reads skip it, and a slot read ahead or later.
        if ((s.skim || s.hash_behind) && (Unneeded(slot) || slot.revisit || slot.complete)) {
          step->kind = Step::Kind::kSkip;
          step->length = slot.end - s.pos;
        } else if (!slot.revisit && !Unneeded(slot)) {
          if (!slot.granted) {
            if (!AdmitFor(slot)) continue;
            Grant(slot);
          }
          step->kind = slot.complete ? Step::Kind::kHashKept : Step::Kind::kRead;
          step->into = slot.bytes.get() + (s.pos - slot.begin);
        }
      } else {
        const uint64_t until = s.next < s.slots.size() ? slots_[s.slots[s.next]].begin : s.size;
        const bool skip = s.skim || s.hash_behind;
        step->length = skip ? until - s.pos : std::min(chunk_, until - s.pos);
        if (skip) step->kind = Step::Kind::kSkip;
      }
      return true;
    }
    return false;
  }

  // Nothing can move and nothing in flight can free memory: the next work item's tensors, with
  // what must be held to reach them, do not fit beside what is held.
  absl::Status Exhausted() {
    uint64_t held = 0, count = 0;
    for (const Slot& s : slots_) {
      if (!s.bytes) continue;
      held += s.size();
      ++count;
    }
    std::string next = "no work item is waiting";
    while (admitted_ < items_.size() && items_[order_[admitted_]].dropped) ++admitted_;
    if (admitted_ < items_.size() && Undecided(order_[admitted_])) {
      next = absl::StrCat(work_[order_[admitted_]].label,
                          " waits for the work it depends on, which cannot get its tensors");
    } else if (admitted_ < items_.size() && AwaitsRelive(order_[admitted_])) {
      next = absl::StrCat(work_[order_[admitted_]].label,
                          " waits for the work before it to free a tensor it reads again");
    } else if (admitted_ < items_.size()) {
      const Slot* far = nullptr;
      const uint64_t cost = Admit(order_[admitted_], /*apply=*/false, &far);
      next = absl::StrCat(work_[order_[admitted_]].label, " needs ", cost,
                          " more bytes: its tensors and every needed tensor stored before them "
                          "in their files");
      if (far != nullptr) {
        absl::StrAppend(&next, " (up to ", streams_[far->stream].label, ", tensor '",
                        far->info->name, "' at offset ", far->begin, ")");
      }
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory window of ", options_.memory_window, " bytes is full: ", count, " tensors (",
        held, " bytes) are held for checks or until the file's hash reaches them, and ", next,
        "; the checkpoints store partner tensors far apart for this window (raise it with "
        "--memory-window)"));
  }

  // The I/O and hashing of one step, outside the lock (the stream is busy: only this thread
  // touches its file and hashers).
  absl::Status DoStep(const Step& step, WorkerTools& tools) {
    FileStream& s = streams_[step.stream];
    const ImageFile& f = *s.out;
    if (s.file == nullptr) {
      // Reopened by name under the same parent: it must still be the file whose header was read.
      absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> opened = f.parent->OpenFile(f.leaf);
      if (!opened.ok()) return opened.status();
      absl::StatusOr<io::FileIdentity> id = (*opened)->Identity();
      if (!id.ok()) return id.status();
      if (!(*id == f.identity)) return io::ChangedWhileRead(s.label, f.identity, *id);
      s.file = *std::move(opened);
    }
    if (s.hashers == nullptr && !s.skim) {
      s.hashers =
          std::make_unique<io_internal::FileHashers>(options_, s.size, f.wants_git_blob_id);
      if (f.safetensors != nullptr && options_.tensor_digests) {
        s.hashers->SetTensors(f.safetensors.get(), &s.out->tensor_digests);
      }
      if (f.content != nullptr) s.hashers->Update(0, *f.content);
    }
    if (step.kind == Step::Kind::kSkip) {
      if (!s.hash_behind) progress_.Advance(step.length);
    } else if (step.length > 0) {
      uint8_t* dst = step.into;
      if (dst == nullptr) {
        if (!tools.scratch) tools.scratch.reset(new uint8_t[chunk_]);
        dst = tools.scratch.get();
      }
      std::span<uint8_t> bytes(dst, step.length);
      const bool revisit = step.slot != kNone && slots_[step.slot].revisit;
      const bool released = step.slot != kNone && slots_[step.slot].released;
      // The digests are of the bytes in memory, the ones every check reads: a range read
      // ahead is hashed from its buffer when the cursor reaches it (or, released, read again
      // by the cursor and compared), and one read behind the cursor must have the hash of the
      // bytes the cursor hashed. A tensor read again later is hashed twice as the cursor passes
      // it (the file's digest and its own), on two threads. Behind the reads, the hashing
      // cursor hashes every slot twice so, and the cursor none.
      const bool hash = s.hash_behind ? step.kind == Step::Kind::kHash
                                      : step.kind != Step::Kind::kReadAhead && !s.skim;
      const bool pass = s.hash_behind ? hash && step.slot != kNone
                                      : (revisit || released) && step.kind == Step::Kind::kRead;
      // Progress counts each byte of the files once: not a second read behind the cursor, nor
      // the cursor's of a released tensor, and behind the reads, only the hashing cursor's.
      const bool counts =
          s.hash_behind ? hash : !(revisit && step.kind == Step::Kind::kReadAhead) && !released;
      const uint64_t piece_size = hash || pass ? kHashPiece : step.length;
      auto digest = [&](uint64_t at, std::span<const uint8_t> piece) -> absl::Status {
        s.hashers->Update(at, piece);
        return Feed(s, at, piece);
      };
      if (step.kind == Step::Kind::kHashKept) {
        if (absl::Status st = digest(step.offset, bytes); !st.ok()) return st;
      } else {
        // Read in pieces, hashed in order on other threads while the next ones are read
        // ("Keeping storage busy"): the copy from storage and the hashes overlap.
        auto settle = [&tools]() -> absl::Status {
          absl::Status st = tools.hash.Wait();
          tools.pass.Wait().IgnoreError();  // Pass cannot fail
          return st;
        };
        for (uint64_t done = 0; done < step.length;) {
          const uint64_t n = std::min<uint64_t>(piece_size, step.length - done);
          const std::span<uint8_t> piece = bytes.subspan(done, n);
          const uint64_t at = step.offset + done;
          if (absl::Status st = io::ReadExactly(*s.file, at, piece, s.label); !st.ok()) {
            settle().IgnoreError();  // their tasks read this step's bytes
            return st;
          }
          if (counts) progress_.Advance(n);
          if (pass) {
            tools.pass.Post([this, &step, at, piece] {
              Pass(slots_[step.slot], at, piece);
              return absl::OkStatus();
            });
          }
          if (hash && done + n == step.length && done == 0) {  // one piece: nothing to overlap
            if (absl::Status d = digest(at, piece); !d.ok()) {
              settle().IgnoreError();
              return d;
            }
          } else if (hash) {
            tools.hash.Post([&digest, at, piece] { return digest(at, piece); });
          }
          done += n;
        }
        if (absl::Status st = settle(); !st.ok()) return st;
      }
      if (s.skim && step.slot != kNone && step.into != nullptr) Skimmed(slots_[step.slot], step);
      if (revisit && step.kind == Step::Kind::kReadAhead && !s.hash_behind && !s.skim) {
        if (absl::Status st = Reread(s, slots_[step.slot], step); !st.ok()) return st;
      }
      // The kernel may drop what the cursor has passed, except a range it will read again: a
      // revisit slot stays cached until its second read (a copy from memory, not a second
      // read from storage), which drops it. A range read ahead stays in its page cache until
      // the cursor passes it: the kernel's own readahead for the cursor may reach it first, and
      // would read it from storage again had it been dropped. Behind the reads, what the
      // hashing cursor has passed is dropped, but for a slot still to be read again.
      const bool again = revisit || (step.slot != kNone && !slots_[step.slot].lives.empty());
      const bool drop = step.kind == Step::Kind::kReadAhead
                            ? revisit
                            : !again && (!s.hash_behind || step.kind == Step::Kind::kHash);
      if (drop) {
        s.file->Consumed(step.offset, step.length);
      }
    }
    const bool ends = s.hash_behind
                          ? step.kind == Step::Kind::kHash && step.offset + step.length == s.size
                          : step.kind == Step::Kind::kClose;
    if (!ends) return absl::OkStatus();
    // The end: the file must not have grown, nor changed, since its header was read.
    uint8_t extra;
    absl::StatusOr<size_t> more = s.file->Read(s.size, std::span<uint8_t>(&extra, 1));
    if (!more.ok()) return more.status();
    if (*more != 0) {
      return absl::DataLossError(absl::StrCat(s.label, ": grew past ", s.size, " bytes while being read"));
    }
    absl::StatusOr<io::FileIdentity> after = s.file->Identity();
    if (!after.ok()) return after.status();
    if (!(*after == f.identity)) return io::ChangedWhileRead(s.label, f.identity, *after);
    if (!s.skim) s.hashers->Finish(s.out);
    s.out->stream_from.reset();
    s.hashers.reset();
    return absl::OkStatus();
  }

  // A skimmed file's slot, once its last byte is in its buffer (outside the lock: the stream is
  // busy, and the slot is lent only after this step): the SHA-256 of the bytes the work reads.
  static void Skimmed(Slot& slot, const Step& step) {
    const uint64_t done = step.kind == Step::Kind::kReadAhead
                              ? slot.filled + step.length
                              : step.offset + step.length - slot.begin;
    if (step.kind == Step::Kind::kHashKept || done < slot.size()) return;
    slot.digest = Sha256Of(std::span<const uint8_t>(slot.bytes.get(), slot.size()));
  }

  // Steps on a revisit slot, outside the lock: the cursor's pass hashes it (only the cursor's
  // steps touch that hash); the re-read, once complete, must have that hash (it runs after the
  // pass: the slot is re-read once the cursor has reached its trigger, beyond it).
  static void Pass(Slot& slot, uint64_t at, std::span<const uint8_t> bytes) {
    if (!slot.passing) slot.passing = std::make_unique<Sha256>();
    slot.passing->Update(bytes);
    if (at + bytes.size() == slot.end) {
      slot.passed_digest = slot.passing->Finish();
      slot.passing.reset();
    }
  }

  static absl::Status Reread(const FileStream& s, const Slot& slot, const Step& step) {
    if (step.offset + step.length < slot.end) return absl::OkStatus();
    if (Sha256Of(std::span<const uint8_t>(slot.bytes.get(), slot.size())) != slot.passed_digest) {
      return absl::DataLossError(absl::StrCat(
          s.label, ": tensor '", slot.info->name, "' at offset ", slot.begin,
          " changed between the hash of the file and its second read"));
    }
    return absl::OkStatus();
  }

  // The part of `bytes` (at `offset`, just hashed by the cursor) each sink covers.
  static absl::Status Feed(FileStream& s, uint64_t offset, std::span<const uint8_t> bytes) {
    const uint64_t end = offset + bytes.size();
    while (s.sink_next < s.sinks.size() && s.sinks[s.sink_next].end <= offset) ++s.sink_next;
    for (size_t k = s.sink_next; k < s.sinks.size() && s.sinks[k].begin < end; ++k) {
      const StreamSink& sink = s.sinks[k];
      const uint64_t from = std::max(offset, sink.begin), to = std::min(end, sink.end);
      if (from >= to) continue;
      absl::Status st = sink.consume(from - sink.begin, bytes.subspan(from - offset, to - from));
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Under the lock, after a step: advance, lend the tensors it completed, free read-ahead
  // buffers the cursor has passed and no work needs.
  void Advance(const Step& step) {
    FileStream& s = streams_[step.stream];
    if (step.kind == Step::Kind::kClose) {
      s.closed = true;
      MaybeClose(s);
      return;
    }
    if (step.kind == Step::Kind::kHash) {
      // What the cursor read in order is read again from the page cache; what it skipped (or
      // reads again later), from storage.
      if (step.slot == kNone || slots_[step.slot].revisit || !slots_[step.slot].granted) {
        s.storage_bytes += step.length;
        bytes_read_ += step.length;
      }
      s.hash_pos += step.length;
      if (step.slot != kNone && step.offset + step.length == slots_[step.slot].end) {
        slots_[step.slot].hashed = true;
        Compare(s, slots_[step.slot]);
      }
      s.closed = !s.out->stream_from;  // DoStep clears it when it has read and checked the end
      MaybeClose(s);
      return;
    }
    if (step.kind != Step::Kind::kHashKept && step.kind != Step::Kind::kSkip) {
      s.storage_bytes += step.length;
      bytes_read_ += step.length;
    }
    if (step.kind == Step::Kind::kReadAhead) {
      Slot& slot = slots_[step.slot];
      slot.filled += step.length;
      if (slot.filled == slot.size()) {
        s.reading_ahead = kNone;
        if (slot.revisit) {
          --s.revisits_left;
          if (!s.skim) {  // a skimmed file's cursor read nothing of it
            ++reread_tensors_;
            reread_bytes_ += slot.size();
          }
        }
        Lend(slot);
        if (slot.users == 0 && slot.release && s.pos < slot.begin) Release(slot);
        Relive(step.slot);  // its units may all have been dropped meanwhile
        MaybeClose(s);
      }
      return;
    }
    s.pos += step.length;
    while (s.next < s.slots.size() && slots_[s.slots[s.next]].end <= s.pos) {
      Slot& slot = slots_[s.slots[s.next]];
      slot.passed = true;
      ++s.next;
      if (slot.released && !s.skim) {  // read again by the cursor: the bytes its units read?
        ++reread_tensors_;
        reread_bytes_ += slot.size();
        if (slot.passed_digest != slot.fetched_digest) {
          Fail(absl::DataLossError(
              absl::StrCat(s.label, ": tensor '", slot.info->name, "' at offset ", slot.begin,
                           " changed between its read ahead for the checks and the file's hash")));
        }
        continue;
      }
      // Hashed from scratch (a revisit slot is read again at its trigger).
      if (slot.revisit || Unneeded(slot)) continue;
      if (!slot.granted) {  // an empty tensor: no bytes to read, a valid pointer
        slot.admitted = true;
        Grant(slot);
      }
      if (!slot.complete) Lend(slot);  // else read ahead: kept until the cursor passed it
      if (slot.users == 0) Free(slot);
      Relive(s.slots[s.next - 1]);
    }
    Arm(s);
  }

  // Under the lock: the file's end is checked (`closed`, after every read behind the cursor,
  // or behind the reads by the hashing cursor); it is closed once no read of it is left.
  void MaybeClose(FileStream& s) {
    if (!s.closed || s.revisits_left > 0 || s.reading_ahead != kNone) return;
    s.file.reset();
    s.done = true;
  }

  // Under the lock, behind the reads: a slot's buffer, as the work read it, and its bytes as
  // the file's hash read them must be the same.
  void Compare(const FileStream& s, const Slot& slot) {
    if (!slot.fetched || !slot.hashed || slot.fetched_digest == slot.passed_digest) return;
    Fail(absl::DataLossError(absl::StrCat(
        s.label, ": tensor '", slot.info->name, "' at offset ", slot.begin,
        " changed between its read for the checks and the file's hash")));
  }

  // Behind the reads, the first item to run on a slot takes the SHA-256 of its buffer first,
  // outside the lock (the buffer stays while the item holds it); false when a slot differs
  // from what the file's hash read, and the item is not run.
  bool TakeFetchedDigests(size_t w, std::unique_lock<std::mutex>& lock) {
    std::vector<size_t> claim;
    for (size_t i : items_[w].slots) {
      Slot& slot = slots_[i];
      // Read in order and again later, or read ahead and released: the check of the second read.
      const FileStream& f = streams_[slot.stream];
      const bool again = ((!slot.lives.empty() && !slot.revisit) || slot.release) && !f.skim;
      if ((!f.hash_behind && !again) || slot.claimed) continue;
      slot.claimed = true;
      claim.push_back(i);
    }
    if (claim.empty()) return true;
    lock.unlock();
    std::vector<Digest> digests;
    for (size_t i : claim) {
      digests.push_back(Sha256Of(std::span<const uint8_t>(slots_[i].bytes.get(), slots_[i].size())));
    }
    lock.lock();
    for (size_t k = 0; k < claim.size(); ++k) {
      Slot& slot = slots_[claim[k]];
      slot.fetched_digest = digests[k];
      slot.fetched = true;
      Compare(streams_[slot.stream], slot);
    }
    return error_.ok();
  }

  void Worker() {
    WorkerTools tools;
    std::unique_lock<std::mutex> lock(mu_);
    while (error_.ok()) {
      if (progress_.Cancelled()) {
        Fail(absl::CancelledError("audit cancelled while reading"));
        break;
      }
      if (!ready_.empty()) {
        auto it = std::min_element(ready_.begin(), ready_.end());
        const size_t w = *it;
        ready_.erase(it);
        ++running_;
        const bool go = TakeFetchedDigests(w, lock);
        lock.unlock();
        absl::Status s = go ? work_[w].run() : absl::OkStatus();
        lock.lock();
        --running_;
        if (!s.ok()) Fail(std::move(s));
        for (size_t i : items_[w].slots) Unuse(i, w);
        Done(w);
        cv_.notify_all();
        continue;
      }
      if (Finished()) {
        cv_.notify_all();
        break;
      }
      Step step;
      if (!PickStep(&step)) {
        if (running_ == 0 && busy_ == 0) {  // nothing in flight can free memory
          Fail(Exhausted());
          break;
        }
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      FileStream& stream = streams_[step.stream];
      const bool alone = !stream.opened;
      bool& flag = step.kind == Step::Kind::kReadAhead ? stream.ahead_busy
                   : step.kind == Step::Kind::kHash    ? stream.hash_busy
                                                       : stream.busy;
      flag = true;
      if (alone) stream.busy = stream.ahead_busy = stream.hash_busy = true;
      ++busy_;
      lock.unlock();
      absl::Status s = DoStep(step, tools);
      lock.lock();
      --busy_;
      flag = false;
      if (alone) stream.busy = stream.ahead_busy = stream.hash_busy = false;
      if (!s.ok()) {
        Fail(std::move(s));
        break;
      }
      stream.opened = true;
      Advance(step);
      cv_.notify_all();
    }
  }

  const ReadOptions& options_;
  Progress& progress_;
  const uint64_t chunk_;
  io::PageBufferPool pool_;  // under mu_
  std::vector<StreamWork> work_;
  std::vector<std::shared_ptr<TreeImage>> out_;
  std::map<const SafetensorsFile*, size_t> by_file_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FileStream> streams_;
  std::vector<Slot> slots_;
  std::vector<Item> items_;
  std::vector<size_t> ready_;
  size_t running_ = 0, busy_ = 0;
  uint64_t kept_ = 0, peak_ = 0, bytes_read_ = 0;
  uint64_t reread_bytes_ = 0, reread_tensors_ = 0;  // tensors passed and read again
  uint64_t need_ = 0;      // bytes admitted work will still take (admitted, not yet granted)
  std::vector<size_t> order_;  // work items in admission order (RankWork)
  std::vector<size_t> rank_;   // each work item's place in order_
  size_t admitted_ = 0;        // order_[0, admitted_) are admitted
  std::optional<uint64_t> next_cost_;  // Admit(order_[admitted_]) while admitted_ is unchanged
  absl::Status error_;
};

}  // namespace

absl::StatusOr<StreamResult> StreamTrees(
    const std::vector<std::shared_ptr<const TreeImage>>& images, std::vector<StreamWork> work,
    const ReadOptions& options, Progress& progress, std::vector<StreamSink> sinks,
    const SkimFiles& skim) {
  Streamer streamer(options, progress);
  return streamer.Run(images, std::move(work), std::move(sinks), skim);
}

}  // namespace ckpt
