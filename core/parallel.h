// Bounded data parallelism: ParallelFor runs fn(i) for i in [0, n) on a fixed number of worker
// threads; a Relay runs tasks in order on one thread beside its owner.
#ifndef CKPT_CORE_PARALLEL_H_
#define CKPT_CORE_PARALLEL_H_

#include <cstddef>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/status.h"

namespace ckpt {

// Number of worker threads to use by default: the machine's hardware threads (at least 1).
unsigned DefaultThreads();

// The most worker threads a caller may ask for (`--threads`, ckpt-auditd's
// `--threads-per-audit`): more than any machine here has cores, few enough to start.
inline constexpr unsigned kMaxThreads = 1024;

// Runs fn(i) for every i in [0, n) on min(threads, n) threads (0 means DefaultThreads()), or on
// fewer, down to the calling thread alone, when the system refuses to create more.
// Work items are handed out in index order. After the first failure no new items start; the
// failure with the lowest index among those run is returned.
absl::Status ParallelFor(size_t n, unsigned threads,
                         const std::function<absl::Status(size_t)>& fn);

// One thread that runs the tasks its owner posts, in order, while the owner goes on: a stream
// cursor's pieces are hashed one after another while the next ones are read, and a written
// shard is hashed while its next chunk is read back. The owner waits for them all (Wait), not
// after each task: waiting after every 1 MiB piece left each cursor waiting 10 of its 25 s on
// the device host (docs/audit-engine.md, "Keeping storage busy"). Where no thread can be
// started, a task runs when it is posted. Once a task has failed, the tasks posted after it
// until Wait do not run (a sink that failed is handed no more bytes).
class Relay {
 public:
  Relay() = default;
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  ~Relay();

  void Post(std::function<absl::Status()> task);

  // Once every posted task has run: the first failure among them (OK when none failed).
  absl::Status Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<absl::Status()>> queue_;
  size_t outstanding_ = 0;  // posted, not yet finished
  bool stop_ = false;
  absl::Status result_;
  std::thread thread_;
};

}  // namespace ckpt

#endif  // CKPT_CORE_PARALLEL_H_
