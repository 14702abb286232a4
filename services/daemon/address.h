// Whether a gRPC or HTTP listen/target address stays on this host. The daemon refuses to serve
// plaintext elsewhere and the CLI refuses to send a token in plaintext elsewhere.
#ifndef CKPT_SERVICES_DAEMON_ADDRESS_H_
#define CKPT_SERVICES_DAEMON_ADDRESS_H_

#include "absl/strings/string_view.h"

namespace ckpt::daemon {

// True for addresses only this host can reach: 127.0.0.0/8, [::1], an IPv4-mapped 127.x
// address, "localhost", and unix: sockets. "host:port" or "[v6]:port"; anything else
// (0.0.0.0, [::], a host name, an empty host, a missing port, an unknown scheme) is not.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_ADDRESS_H_
