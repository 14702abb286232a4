// Runs a program to completion and collects what it printed: the daemon's calls to the Slurm
// commands (slurm_executor.h). No shell: `argv` goes to the program as given.
#ifndef CKPT_SERVICES_DAEMON_COMMAND_H_
#define CKPT_SERVICES_DAEMON_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::daemon {

struct CommandResult {
  int exit_code = -1;  // -1 when a signal ended it
  std::string out, err;  // each at most kMaxCommandOutput bytes (the rest is read and dropped)
};

inline constexpr size_t kMaxCommandOutput = 1 << 20;

// Runs argv[0] (looked up on PATH when it has no slash) with stdin from /dev/null. UNAVAILABLE
// when it cannot be started; DEADLINE_EXCEEDED, after killing it, when it runs past `timeout`.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout);

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_COMMAND_H_
