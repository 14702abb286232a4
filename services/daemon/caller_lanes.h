// Per-caller lanes in front of a CallPool (docs/daemon.md "Limits"): at most `running` calls of
// one caller are in the pool at once; more wait in that caller's own lane (at most `waiting`),
// in arrival order, and enter the pool as that caller's earlier calls finish. Gates use them:
// every gate reads its whole tree (content_fingerprint.h), so one token could otherwise fill
// every work thread with reads of terabytes while other callers wait.
#ifndef CKPT_SERVICES_DAEMON_CALLER_LANES_H_
#define CKPT_SERVICES_DAEMON_CALLER_LANES_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "services/daemon/call_pool.h"

namespace ckpt::daemon {

class CallerLanes {
 public:
  // `pool` must outlive the lanes' last call: declare the lanes before the pool, whose
  // destructor runs what still waits (and so finishes the lanes' calls).
  CallerLanes(CallPool& pool, size_t running, size_t waiting)
      : pool_(pool), running_(running), waiting_(waiting) {}
  CallerLanes(const CallerLanes&) = delete;
  CallerLanes& operator=(const CallerLanes&) = delete;

  // Runs `work` on the pool in `caller`'s turn. `abandoned` as for CallPool::Submit (a waiting
  // call no longer wanted leaves a full lane first, run at once on the calling thread);
  // `refuse` answers the call when the pool itself refuses it (its queue full). False, and
  // nothing queued, when the caller's lane is full.
  bool Submit(const std::string& caller, std::function<void()> work,
              std::function<bool()> abandoned, std::function<void()> refuse);

  // The calls waiting in every lane for their caller's turn, at this moment.
  size_t waiting() const;

 private:
  struct Item {
    std::function<void()> work;
    std::function<bool()> abandoned;
    std::function<void()> refuse;
  };
  struct Lane {
    size_t running = 0;  // calls of the caller handed to the pool and not finished
    std::deque<Item> waiting;
  };
  void Dispatch(const std::string& caller, Item item);
  // One of `caller`'s calls in the pool finished: the next of its lane takes its place.
  void Finished(const std::string& caller);

  CallPool& pool_;
  const size_t running_;
  const size_t waiting_;
  mutable std::mutex mu_;
  std::map<std::string, Lane> lanes_;  // guarded by mu_; a caller's lane while it has calls
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_CALLER_LANES_H_
