// A bounded set of threads, started as needed, for the calls that may run long or wait
// (docs/daemon.md, "Threads and memory"): gRPC's callback threads hand such calls here so that
// they never hold up the quick reads, and the number of them running at once stays bounded.
#ifndef CKPT_SERVICES_DAEMON_CALL_POOL_H_
#define CKPT_SERVICES_DAEMON_CALL_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt::daemon {

class CallPool {
 public:
  // Up to `threads` (at least 1) run the work, started as work arrives that finds none idle; at
  // most `max_waiting` items wait for one.
  CallPool(int threads, size_t max_waiting);
  // Runs what is still waiting, then joins the threads.
  ~CallPool();
  CallPool(const CallPool&) = delete;
  CallPool& operator=(const CallPool&) = delete;

  // Queues `work`. `abandoned` says whether it is still wanted: when `max_waiting` items wait,
  // those no longer wanted leave the queue first and run at once on the calling thread (their
  // work must then only say that nobody waits for it). False, and `work` dropped unrun, when
  // the queue is still full.
  bool Submit(std::function<void()> work, std::function<bool()> abandoned);

  // The calls running on the threads and those waiting for one, at this moment: what a test
  // waits for before it asserts on a busy pool.
  struct Load {
    size_t running = 0;
    size_t waiting = 0;
  };
  Load load() const;

 private:
  struct Item {
    std::function<void()> work;
    std::function<bool()> abandoned;
  };
  void Loop();

  const size_t max_threads_;
  const size_t max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> waiting_;          // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  size_t idle_ = 0;                   // guarded by mu_: threads waiting for work
  size_t running_ = 0;                // guarded by mu_: threads running a call
  std::vector<std::thread> threads_;  // guarded by mu_
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_CALL_POOL_H_
