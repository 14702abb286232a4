#include "services/daemon/call_pool.h"

#include <algorithm>

namespace ckpt::daemon {

CallPool::CallPool(int threads, size_t max_waiting)
    : max_threads_(static_cast<size_t>(std::max(1, threads))), max_waiting_(max_waiting) {}

CallPool::~CallPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();  // no Submit any more: threads_ is not changing
}

bool CallPool::Submit(std::function<void()> work, std::function<bool()> abandoned) {
  std::vector<std::function<void()>> unwanted;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_.size() >= max_waiting_) {
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (it->abandoned()) {
          unwanted.push_back(std::move(it->work));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (waiting_.size() < max_waiting_) {
      waiting_.push_back({std::move(work), std::move(abandoned)});
      queued = true;
      if (waiting_.size() > idle_ && threads_.size() < max_threads_) {
        threads_.emplace_back([this] { Loop(); });
      }
    }
  }
  if (queued) cv_.notify_one();
  for (auto& w : unwanted) w();
  return queued;
}

void CallPool::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      --idle_;
      if (waiting_.empty()) return;  // stopping, and nothing left
      work = std::move(waiting_.front().work);
      waiting_.pop_front();
      ++running_;
    }
    work();
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

CallPool::Load CallPool::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {running_, waiting_.size()};
}

}  // namespace ckpt::daemon
