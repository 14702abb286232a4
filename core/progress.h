// Progress reporting for long work. Core code reports units of work (bytes, tensors); the CLI
// draws a bar on a terminal or prints plain lines; the daemon streams events.
#ifndef CKPT_CORE_PROGRESS_H_
#define CKPT_CORE_PROGRESS_H_

#include <cstdint>
#include <string_view>

namespace ckpt {

// Implementations must make Advance and Cancelled thread-safe: workers call them concurrently.
class Progress {
 public:
  virtual ~Progress() = default;
  virtual void Begin(std::string_view phase, uint64_t total_units) = 0;
  virtual void Advance(uint64_t units) = 0;
  virtual void End() = 0;
  // True once whoever asked for the work no longer wants it (a cancelled daemon job, a gate
  // whose client left or whose deadline passed). Long work polls it between bounded units (at
  // least every few hundred milliseconds) and then stops with absl::CancelledError, signing
  // nothing. Cheap to call.
  virtual bool Cancelled() const { return false; }
};

// A Progress that discards everything.
Progress& NoProgress();

}  // namespace ckpt

#endif  // CKPT_CORE_PROGRESS_H_
