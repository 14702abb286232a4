// What `ckpt-audit gate` remembers between runs (docs/daemon.md "Gate clients"): for each
// question (the root as the signed decision names it, the scale-window policy, the source pin)
// the time of the newest verified decision it has seen, so that a server cannot answer with a
// decision older than one this user already saw (a replayed PASS from before a newer FAIL).
//
// The file is $XDG_STATE_HOME/ckpt-audit/gate-decisions.json (default
// ~/.local/state/ckpt-audit), mode 0600 in a 0700 directory, replaced atomically. Two gates run
// at once may lose one update; neither ever accepts an older decision than the file holds.
#ifndef CKPT_SERVICES_CLI_GATE_STATE_H_
#define CKPT_SERVICES_CLI_GATE_STATE_H_

#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::cli {

struct GateQuestion {
  std::string root;    // name-encoded, as the decision's resourceUri names it
  std::string policy;  // scale-window policy name
  std::string source;  // pinned source ROOT (lower-case hex), or empty
};

class GateState {
 public:
  // The per-user file; empty when there is none yet. FAILED_PRECONDITION for a file others can
  // write, INVALID_ARGUMENT naming it when it does not parse.
  static absl::StatusOr<GateState> Load();

  std::optional<absl::Time> Newest(const GateQuestion& q) const;
  // Records `t` for `q` when it is newer than what is held, and rewrites the file.
  absl::Status Remember(const GateQuestion& q, absl::Time t);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::map<std::tuple<std::string, std::string, std::string>, absl::Time> newest_;
};

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_GATE_STATE_H_
