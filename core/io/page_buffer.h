// A buffer of whole pages mapped from the kernel and unmapped when freed: the stream's tensor
// buffers (core/io/tree_stream.h), so that the process's memory follows what the window holds.
// Buffers from malloc, freed by other threads than the ones that allocated them, stay in
// malloc's per-thread arenas: with 16 threads, a 1.5 GiB window measured 1.95 GB of RSS for
// `audit --source` and 2.7 GB with the block forward (docs/audit-engine.md, "Memory").
#ifndef CKPT_CORE_IO_PAGE_BUFFER_H_
#define CKPT_CORE_IO_PAGE_BUFFER_H_

#include <sys/mman.h>

#include <cstdint>
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

  uint8_t* get() const { return data_; }
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

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_PAGE_BUFFER_H_
