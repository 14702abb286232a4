// What the backend tells an observer as audits and gates finish, so the daemon can export
// metrics (metrics.h) without the backend knowing any metrics library.
#ifndef CKPT_SERVICES_DAEMON_AUDIT_OBSERVER_H_
#define CKPT_SERVICES_DAEMON_AUDIT_OBSERVER_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt::daemon {

// Called from worker and RPC threads at once: implementations must be thread-safe.
class AuditObserver {
 public:
  virtual ~AuditObserver() = default;
  // An audit job ended: `verdict` is "pass" or "fail", or "error" when it could not run;
  // `bytes_read` is what it read from storage, both trees of a pair (0 on error).
  virtual void AuditFinished(std::string_view verdict, double seconds, uint64_t bytes_read) = 0;
  virtual void GateDecided(bool pass) = 0;
  // --attach: job `job`'s record was pushed as referrers of the OCI manifest `subject`, or
  // could not be (`result`); the record stays in the log either way.
  virtual void Attached(std::string_view job, std::string_view subject,
                        const absl::Status& result) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_AUDIT_OBSERVER_H_
