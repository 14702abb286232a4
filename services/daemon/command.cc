#include "services/daemon/command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ckpt::daemon {
namespace {

// Both ends close on exec; the child's end is dup'ed onto its stdout or stderr.
bool Pipe(int fds[2]) { return ::pipe2(fds, O_CLOEXEC) == 0; }

}  // namespace

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("no command");
  int out[2], err[2];
  if (!Pipe(out)) return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (!Pipe(err)) {
    ::close(out[0]);
    ::close(out[1]);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return absl::UnavailableError(absl::StrCat(argv[0], ": cannot run: ", std::strerror(rc)));
  }
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  bool timed_out = false;
  for (int open = 2; open > 0;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        const size_t keep = std::min(static_cast<size_t>(got),
                                     kMaxCommandOutput - std::min(kMaxCommandOutput,
                                                                  sinks[i]->size()));
        sinks[i]->append(buf, keep);
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (const pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(argv[0], ": no answer within ",
                                                    absl::FormatDuration(timeout)));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace ckpt::daemon
