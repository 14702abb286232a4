#include "services/daemon/caller_lanes.h"

#include <optional>
#include <utility>
#include <vector>

namespace ckpt::daemon {

bool CallerLanes::Submit(const std::string& caller, std::function<void()> work,
                         std::function<bool()> abandoned, std::function<void()> refuse) {
  Item item{std::move(work), std::move(abandoned), std::move(refuse)};
  std::vector<std::function<void()>> unwanted;
  bool now = false, queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Lane& lane = lanes_[caller];
    if (lane.running < running_) {
      ++lane.running;
      now = true;
    } else {
      if (lane.waiting.size() >= waiting_) {
        for (auto it = lane.waiting.begin(); it != lane.waiting.end();) {
          if (it->abandoned()) {
            unwanted.push_back(std::move(it->work));
            it = lane.waiting.erase(it);
          } else {
            ++it;
          }
        }
      }
      if (lane.waiting.size() < waiting_) {
        lane.waiting.push_back(std::move(item));
        queued = true;
      }
    }
  }
  for (auto& w : unwanted) w();
  if (now) Dispatch(caller, std::move(item));
  return now || queued;
}

void CallerLanes::Dispatch(const std::string& caller, Item item) {
  auto run = [this, caller, work = std::move(item.work)] {
    work();
    Finished(caller);
  };
  if (!pool_.Submit(std::move(run), std::move(item.abandoned))) {
    item.refuse();
    Finished(caller);
  }
}

size_t CallerLanes::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [caller, lane] : lanes_) n += lane.waiting.size();
  return n;
}

void CallerLanes::Finished(const std::string& caller) {
  std::optional<Item> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lanes_.find(caller);
    if (it == lanes_.end()) return;
    Lane& lane = it->second;
    if (!lane.waiting.empty()) {
      next = std::move(lane.waiting.front());
      lane.waiting.pop_front();
    } else if (--lane.running == 0) {
      lanes_.erase(it);
    }
  }
  if (next) Dispatch(caller, *std::move(next));
}

}  // namespace ckpt::daemon
