// Bounded data parallelism: run fn(i) for i in [0, n) on a fixed number of worker threads.
#ifndef CKPT_CORE_PARALLEL_H_
#define CKPT_CORE_PARALLEL_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace ckpt {

// Number of worker threads to use by default: the machine's hardware threads (at least 1).
unsigned DefaultThreads();

// Runs fn(i) for every i in [0, n) on min(threads, n) threads (0 means DefaultThreads()), or on
// fewer, down to the calling thread alone, when the system refuses to create more.
// Work items are handed out in index order. After the first failure no new items start; the
// failure with the lowest index among those run is returned.
absl::Status ParallelFor(size_t n, unsigned threads,
                         const std::function<absl::Status(size_t)>& fn);

}  // namespace ckpt

#endif  // CKPT_CORE_PARALLEL_H_
