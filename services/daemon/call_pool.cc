#include "services/daemon/call_pool.h"

#include <algorithm>

namespace ckpt::daemon {

CallPool::CallPool(int threads, size_t max_waiting) : max_waiting_(max_waiting) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

CallPool::~CallPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool CallPool::Submit(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_.size() >= max_waiting_) return false;
    waiting_.push_back(std::move(work));
  }
  cv_.notify_one();
  return true;
}

void CallPool::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // stopping, and nothing left
      work = std::move(waiting_.front());
      waiting_.pop_front();
    }
    work();
  }
}

}  // namespace ckpt::daemon
