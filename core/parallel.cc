#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt {

unsigned DefaultThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

absl::Status ParallelFor(size_t n, unsigned threads,
                         const std::function<absl::Status(size_t)>& fn) {
  if (n == 0) return absl::OkStatus();
  if (threads == 0) threads = DefaultThreads();
  threads = static_cast<unsigned>(std::min<size_t>(threads, n));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t first_bad = n;
  absl::Status first_status;
  auto worker = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < first_bad) {
          first_bad = i;
          first_status = std::move(s);
        }
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 1; t < threads; ++t) {
    // The system may refuse a thread (a process or container thread limit reached): the work
    // then runs on the threads there are, at least the caller's; it is never a crash.
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (std::thread& t : pool) t.join();
  return first_status;
}

Relay::~Relay() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Relay::Post(std::function<absl::Status()> task) {
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { Loop(); });
    } catch (const std::system_error&) {
      if (result_.ok()) result_ = task();
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++outstanding_;
  }
  cv_.notify_all();
}

absl::Status Relay::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return outstanding_ == 0; });
  return std::exchange(result_, absl::OkStatus());
}

void Relay::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, nothing left to run
    std::function<absl::Status()> task = std::move(queue_.front());
    queue_.pop_front();
    const bool failed = !result_.ok();  // only this thread sets it while tasks are queued
    lock.unlock();
    absl::Status s = failed ? absl::OkStatus() : task();
    lock.lock();
    if (result_.ok()) result_ = std::move(s);
    if (--outstanding_ == 0) cv_.notify_all();
  }
}

}  // namespace ckpt
