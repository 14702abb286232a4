// An owned file descriptor: closed when the owner goes (or at Reset / Close), movable, not
// copyable.
#ifndef CKPT_CORE_IO_FD_H_
#define CKPT_CORE_IO_FD_H_

#include <unistd.h>

#include <utility>

namespace ckpt::io {

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes now; false when close reports an error (a delayed write error).
  bool Close() { return ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

}  // namespace ckpt::io

#endif  // CKPT_CORE_IO_FD_H_
