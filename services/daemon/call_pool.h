// A fixed set of threads for the calls that may run long or wait (docs/daemon.md, "Threads and
// memory"): gRPC's callback threads hand such calls here so that they never hold up the quick
// reads, and the number of them running at once stays bounded.
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
  // `threads` >= 1 run the work; at most `max_waiting` items wait for one.
  CallPool(int threads, size_t max_waiting);
  // Runs what is still waiting, then joins the threads.
  ~CallPool();
  CallPool(const CallPool&) = delete;
  CallPool& operator=(const CallPool&) = delete;

  // False, and `work` dropped unrun, when `max_waiting` items already wait.
  bool Submit(std::function<void()> work);

 private:
  void Loop();

  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> waiting_;  // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_CALL_POOL_H_
