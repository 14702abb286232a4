#include "core/io/tree_stream.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/io/file_hashers.h"
#include "core/parallel.h"

namespace ckpt {
namespace {

constexpr size_t kNoWork = std::numeric_limits<size_t>::max();

// A read chunk: small windows get small chunks, so that the scratch buffers stay small next
// to what they bound.
uint64_t ChunkFor(uint64_t window) {
  return std::clamp<uint64_t>(window / 16, 64ull << 10, 8ull << 20);
}

// One tensor some work needs, while it is read and held.
struct Slot {
  size_t stream = 0;
  const TensorInfo* info = nullptr;
  uint64_t begin = 0, end = 0;  // absolute offsets in the file
  size_t key = kNoWork;         // the earliest work item that needs it
  std::vector<size_t> work;
  size_t users = 0;             // work items not yet run that need it
  std::unique_ptr<uint8_t[]> bytes;
  uint64_t size() const { return end - begin; }
};

// The unread rest of one deferred file.
struct FileStream {
  ImageFile* out = nullptr;  // in the completed image
  std::string label;
  uint64_t pos = 0, size = 0;
  std::vector<size_t> slots;  // by offset
  size_t next = 0;            // first slot not yet fully read
  std::multiset<size_t> unallocated;  // keys of its slots not yet given memory
  bool busy = false, done = false;
  // Touched only by the thread that holds `busy`.
  std::unique_ptr<io::RandomAccessFile> file;
  std::unique_ptr<io_internal::FileHashers> hashers;
};

struct Item {
  std::vector<size_t> slots;
  size_t missing = 0;  // slots not yet read
};

// One read of a range of a stream, decided under the lock and done outside it.
struct Step {
  size_t stream = 0;
  uint64_t offset = 0, length = 0;
  uint8_t* into = nullptr;  // a slot's buffer, or null for the thread's scratch
};

class Streamer {
 public:
  Streamer(const ReadOptions& options, Progress& progress)
      : options_(options), progress_(progress), chunk_(ChunkFor(options.memory_window)) {}

  ~Streamer() {
    for (Slot& s : slots_) {
      if (s.bytes) File(s).Reclaim(*s.info);
    }
  }

  absl::StatusOr<StreamResult> Run(const std::vector<std::shared_ptr<const TreeImage>>& images,
                                   std::vector<StreamWork> work) {
    work_ = std::move(work);
    for (const auto& image : images) {
      auto copy = std::make_shared<TreeImage>(*image);
      kept_ += copy->kept_bytes;
      for (ImageFile& f : copy->files) {
        if (!f.stream_from) continue;
        copy->bytes_read += f.size() - *f.stream_from;  // when the stream succeeds
        FileStream s;
        s.out = &f;
        s.label = absl::StrCat(copy->root, "/", f.path);
        s.pos = *f.stream_from;
        s.size = f.size();
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
    StreamResult result;
    result.bytes_read = bytes_read_;
    result.peak_kept_bytes = peak_;
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

  // Slots for every tensor of a deferred file that some work needs; items with all their
  // tensors already in memory are ready at once.
  absl::Status Plan() {
    std::map<std::pair<size_t, const TensorInfo*>, size_t> slot_of;
    items_.resize(work_.size());
    for (size_t w = 0; w < work_.size(); ++w) {
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
          s.key = w;
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
      if (items_[w].missing == 0) ready_.push_back(w);
    }
    for (const Slot& slot : slots_) {
      unallocated_.insert(slot.key);
      streams_[slot.stream].unallocated.insert(slot.key);
    }
    for (const Item& item : items_) {
      std::map<size_t, uint64_t> per_stream;
      for (size_t j : item.slots) per_stream[slots_[j].stream] += slots_[j].size();
      for (const auto& [stream, bytes] : per_stream) headroom_ = std::max(headroom_, bytes);
    }
    for (FileStream& s : streams_) {
      std::sort(s.slots.begin(), s.slots.end(),
                [&](size_t a, size_t b) { return slots_[a].begin < slots_[b].begin; });
    }
    return absl::OkStatus();
  }

  void Fail(absl::Status s) {
    if (error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }

  bool Finished() const {
    if (!ready_.empty() || running_ > 0) return false;
    return std::all_of(streams_.begin(), streams_.end(), [](const FileStream& s) { return s.done; });
  }

  // Which stream reads next: those that need no new memory (nothing needed left, or a tensor
  // already being read) or whose next tensor this stream alone will release go first; then
  // the earliest work item the next tensor serves.
  size_t KeyOf(const FileStream& s) const {
    if (s.next >= s.slots.size()) return 0;
    const Slot& slot = slots_[s.slots[s.next]];
    if (slot.bytes || SelfContained(slot)) return 0;
    return slot.key + 1;
  }

  // True when every work item that needs the slot waits, besides tensors already in memory,
  // only for tensors later in the same file: reading on in this file releases it, with no help
  // from any other file.
  bool SelfContained(const Slot& slot) const {
    for (size_t w : slot.work) {
      for (size_t j : items_[w].slots) {
        const Slot& other = slots_[j];
        if (&other != &slot && !other.bytes && other.stream != slot.stream) return false;
      }
    }
    return true;
  }

  // Picks the next read. `strict`: memory is granted in priority order only (a stream denied
  // it stops later streams from taking any); otherwise to any stream whose tensor fits, which
  // is how a stuck stream gets going when nothing else can move. False when no stream can.
  bool PickStep(Step* step, bool strict) {
    std::vector<size_t> order;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (!streams_[i].busy && !streams_[i].done) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return KeyOf(streams_[a]) < KeyOf(streams_[b]); });
    // The earliest work item still missing a tensor that has no memory yet.
    const size_t behind = unallocated_.empty() ? kNoWork : *unallocated_.begin();
    bool denied = false;
    for (size_t i : order) {
      FileStream& s = streams_[i];
      step->stream = i;
      step->offset = s.pos;
      step->into = nullptr;
      if (s.next < s.slots.size() && s.pos >= slots_[s.slots[s.next]].begin) {
        Slot& slot = slots_[s.slots[s.next]];
        if (!slot.bytes) {
          // A tensor that waits for another file must leave room for the largest share of
          // one work item in one file, so that the earliest work item can always complete:
          // only the files that hold its missing tensors may use that room.
          const bool reserved = (!s.unallocated.empty() && *s.unallocated.begin() <= behind) ||
                                SelfContained(slot);
          const uint64_t room = reserved ? 0 : headroom_;
          if ((denied && strict) || kept_ + slot.size() + room > options_.memory_window) {
            if (!denied) blocked_ = s.slots[s.next];
            denied = true;
            continue;
          }
          slot.bytes.reset(new uint8_t[slot.size()]);
          unallocated_.erase(unallocated_.find(slot.key));
          s.unallocated.erase(s.unallocated.find(slot.key));
          kept_ += slot.size();
          peak_ = std::max(peak_, kept_);
        }
        step->length = std::min(chunk_, slot.end - s.pos);
        step->into = slot.bytes.get() + (s.pos - slot.begin);
        return true;
      }
      const uint64_t until = s.next < s.slots.size() ? slots_[s.slots[s.next]].begin : s.size;
      step->length = std::min(chunk_, until - s.pos);
      return true;
    }
    return false;
  }

  absl::Status Exhausted() const {
    uint64_t held = 0, count = 0;
    size_t first_waiting = kNoWork;
    for (const Slot& s : slots_) {
      if (!s.bytes) continue;
      held += s.size();
      ++count;
      for (size_t w : s.work) {
        if (items_[w].missing > 0) first_waiting = std::min(first_waiting, w);
      }
    }
    const Slot& b = slots_[blocked_];
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory window of ", options_.memory_window, " bytes is full: ", count, " tensors (",
        held, " bytes) are held for checks whose other tensors are not read yet",
        first_waiting == kNoWork ? "" : absl::StrCat(" (first: ", work_[first_waiting].label, ")"),
        ", and ", streams_[b.stream].label, " needs ", b.size(), " more bytes for tensor '",
        b.info->name, "' at offset ", b.begin,
        "; the checkpoints store partner tensors far apart for this window (raise it with "
        "--memory-window)"));
  }

  // The I/O and hashing of one step, outside the lock (the stream is busy: only this thread
  // touches its file and hashers).
  absl::Status DoStep(const Step& step, std::unique_ptr<uint8_t[]>& scratch) {
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
      s.hashers =
          std::make_unique<io_internal::FileHashers>(options_, s.size, f.wants_git_blob_id);
      if (f.safetensors != nullptr && options_.tensor_digests) {
        s.hashers->SetTensors(f.safetensors.get(), &s.out->tensor_digests);
      }
      if (f.content != nullptr) s.hashers->Update(0, *f.content);
    }
    if (step.length > 0) {
      uint8_t* dst = step.into;
      if (dst == nullptr) {
        if (!scratch) scratch.reset(new uint8_t[chunk_]);
        dst = scratch.get();
      }
      std::span<uint8_t> bytes(dst, step.length);
      if (absl::Status st = io::ReadExactly(*s.file, step.offset, bytes, s.label); !st.ok()) {
        return st;
      }
      s.hashers->Update(step.offset, bytes);
      s.file->Consumed(step.offset, step.length);
      progress_.Advance(step.length);
    }
    if (step.offset + step.length < s.size) return absl::OkStatus();
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
    s.hashers->Finish(s.out);
    s.out->stream_from.reset();
    s.file.reset();
    s.hashers.reset();
    return absl::OkStatus();
  }

  // Under the lock, after a step: advance, and lend the tensors it completed.
  void Advance(const Step& step) {
    FileStream& s = streams_[step.stream];
    s.pos += step.length;
    bytes_read_ += step.length;
    s.done = !s.out->stream_from;  // DoStep clears it when it has read and checked the end
    while (s.next < s.slots.size() && slots_[s.slots[s.next]].end <= s.pos) {
      Slot& slot = slots_[s.slots[s.next]];
      // An empty tensor has no bytes to read: give it a valid pointer.
      if (!slot.bytes) {
        slot.bytes.reset(new uint8_t[1]);
        unallocated_.erase(unallocated_.find(slot.key));
        s.unallocated.erase(s.unallocated.find(slot.key));
      }
      File(slot).Lend(*slot.info, slot.bytes.get());
      for (size_t w : slot.work) {
        if (--items_[w].missing == 0) ready_.push_back(w);
      }
      ++s.next;
    }
  }

  // Under the lock, after work item `w` ran: free what nobody needs any more.
  void Release(size_t w) {
    for (size_t i : items_[w].slots) {
      Slot& slot = slots_[i];
      if (--slot.users > 0) continue;
      File(slot).Reclaim(*slot.info);
      kept_ -= slot.size();
      slot.bytes.reset();
    }
  }

  void Worker() {
    std::unique_ptr<uint8_t[]> scratch;
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
        lock.unlock();
        absl::Status s = work_[w].run();
        lock.lock();
        --running_;
        if (!s.ok()) Fail(std::move(s));
        Release(w);
        cv_.notify_all();
        continue;
      }
      if (Finished()) {
        cv_.notify_all();
        break;
      }
      Step step;
      const bool alone = running_ == 0 && busy_ == 0;  // nothing in flight can free memory
      if (!PickStep(&step, /*strict=*/true) && !(alone && PickStep(&step, /*strict=*/false))) {
        const bool all_read = std::all_of(streams_.begin(), streams_.end(),
                                          [](const FileStream& s) { return s.done || s.busy; });
        if (!all_read && alone) {
          Fail(Exhausted());
          break;
        }
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      streams_[step.stream].busy = true;
      ++busy_;
      lock.unlock();
      absl::Status s = DoStep(step, scratch);
      lock.lock();
      --busy_;
      streams_[step.stream].busy = false;
      if (!s.ok()) {
        Fail(std::move(s));
        break;
      }
      Advance(step);
      cv_.notify_all();
    }
  }

  const ReadOptions& options_;
  Progress& progress_;
  const uint64_t chunk_;
  std::vector<StreamWork> work_;
  std::vector<std::shared_ptr<TreeImage>> out_;
  std::map<const SafetensorsFile*, size_t> by_file_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FileStream> streams_;
  std::vector<Slot> slots_;
  std::vector<Item> items_;
  std::vector<size_t> ready_;
  size_t running_ = 0, busy_ = 0, blocked_ = 0;
  uint64_t kept_ = 0, peak_ = 0, bytes_read_ = 0;
  uint64_t headroom_ = 0;  // the most bytes one work item needs from one file
  std::multiset<size_t> unallocated_;  // keys of the slots not yet given memory
  absl::Status error_;
};

}  // namespace

absl::StatusOr<StreamResult> StreamTrees(
    const std::vector<std::shared_ptr<const TreeImage>>& images, std::vector<StreamWork> work,
    const ReadOptions& options, Progress& progress) {
  Streamer streamer(options, progress);
  return streamer.Run(images, std::move(work));
}

}  // namespace ckpt
