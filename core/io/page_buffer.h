// A buffer of whole pages mapped from the kernel and unmapped when freed: the stream's tensor
// buffers (core/io/tree_stream.h), so that the process's memory follows what the window holds.
// Buffers from malloc, freed by other threads than the ones that allocated them, stay in
// malloc's per-thread arenas: with 16 threads, a 1.5 GiB window measured 1.95 GB of RSS for
// `audit --source` and 2.7 GB with the block forward (docs/audit-engine.md, "Memory").
// PageBufferPool keeps a bounded number of freed mappings for the next buffer of the same size:
// a fresh mapping costs a page fault and a zeroed page per 4 KiB on its first write.
#ifndef CKPT_CORE_IO_PAGE_BUFFER_H_
#define CKPT_CORE_IO_PAGE_BUFFER_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <new>
#include <utility>

namespace ckpt::io {

// Buffers of `map_from` bytes or more are mapped; smaller ones come from `new` (the stream
// passes a floor that keeps the number of mappings far below the kernel's limit per process).
class PageBuffer {
 public:
  PageBuffer() = default;
  // At least one byte. std::bad_alloc when memory is refused, as `new` would.
  PageBuffer(uint64_t size, uint64_t map_from) : size_(size == 0 ? 1 : size) {
    if (size_ < map_from) {
      data_ = new uint8_t[size_];
      return;
    }
    size_ = MappedSize(size_);
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    mapped_ = true;
  }
  PageBuffer(PageBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        mapped_(std::exchange(o.mapped_, false)) {}
  PageBuffer& operator=(PageBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_ = std::exchange(o.mapped_, false);
    }
    return *this;
  }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer() { reset(); }

  // A mapped buffer's size is the requested one rounded up to whole pages.
  static uint64_t MappedSize(uint64_t size) {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    return (size + page - 1) / page * page;
  }

  uint8_t* get() const { return data_; }
  uint64_t size() const { return size_; }
  bool mapped() const { return mapped_; }
  explicit operator bool() const { return data_ != nullptr; }
  void reset() {
    if (mapped_) {
      ::munmap(data_, size_);
    } else {
      delete[] data_;
    }
    data_ = nullptr;
    size_ = 0;
    mapped_ = false;
  }

 private:
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
};

// Freed mappings kept for reuse, at most `capacity` bytes of them (the oldest are unmapped
// first). Not thread-safe: its owner locks. A reused buffer holds the bytes of the tensor it
// held before: its new owner fills every byte before reading any.
class PageBufferPool {
 public:
  PageBufferPool(uint64_t capacity, uint64_t map_from)
      : capacity_(capacity), map_from_(map_from) {}

  // A kept mapping of the same page-rounded size, else a new buffer.
  PageBuffer Take(uint64_t size) {
    if (size >= map_from_) {
      const uint64_t want = PageBuffer::MappedSize(size);
      for (auto it = kept_.begin(); it != kept_.end(); ++it) {
        if (it->size() != want) continue;
        PageBuffer b = std::move(*it);
        kept_.erase(it);
        kept_bytes_ -= want;
        return b;
      }
    }
    return PageBuffer(size, map_from_);
  }

  // Keeps a mapped buffer (within the capacity); frees anything else.
  void Give(PageBuffer b) {
    if (!b.mapped() || b.size() > capacity_) return;
    kept_bytes_ += b.size();
    kept_.push_back(std::move(b));
    while (kept_bytes_ > capacity_) {
      kept_bytes_ -= kept_.front().size();
      kept_.pop_front();
    }
  }

  uint64_t kept_bytes() const { return kept_bytes_; }

 private:
  const uint64_t capacity_, map_from_;
  std::deque<PageBuffer> kept_;
  uint64_t kept_bytes_ = 0;
};

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_PAGE_BUFFER_H_
