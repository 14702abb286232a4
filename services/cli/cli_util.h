// Shared pieces of the CLI: exit codes, error printing and terminal progress.
#ifndef CKPT_SERVICES_CLI_CLI_UTIL_H_
#define CKPT_SERVICES_CLI_CLI_UTIL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/evidence/key_source.h"
#include "core/fingerprint/fingerprint.h"
#include "core/progress.h"

namespace ckpt::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitError = 2;

// Prints "ckpt-audit: <code>: <message>" on stderr and returns kExitError.
int ReportError(const absl::Status& status);

// A bar redrawn in place on a terminal (stderr is a TTY), else one plain line per 10%.
class TerminalProgress final : public Progress {
 public:
  TerminalProgress();
  void Begin(std::string_view phase, uint64_t total_units) override;
  void Advance(uint64_t units) override;
  void End() override;

 private:
  void Draw(uint64_t done, bool final_line);
  const bool tty_;
  std::mutex mu_;
  std::string phase_;
  uint64_t total_ = 0;
  std::atomic<uint64_t> done_{0};
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

std::string HumanBytes(uint64_t bytes);

// A size in bytes: a byte count ("1048576") or a binary size ("256M" or "256MiB" = 256 MiB,
// "1.5G", "2GiB", "64K", "1T"; case-insensitive). INVALID_ARGUMENT for anything else, for a
// size that overflows 64 bits, and for a fraction of a byte.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

// `--memory-window SIZE` on a command that reads tensor data (docs/audit-engine.md, "Memory"):
// ParseByteSize, at least kMinReadChunk (one read chunk); a bad value is a usage error
// (exit 2) naming the flag.
void AddMemoryWindowFlag(CLI::App* cmd, uint64_t* window);

// `--pkcs11-module PATH`, `--pin-file PATH` and `--pin-env NAME`: how a command whose --key is a
// pkcs11: URI reaches the token (core/evidence/key_source.h). The same flags on every command
// that signs.
void AddPkcs11Flags(CLI::App* cmd, evidence::KeySource* source);

// `--part I/N` of `fingerprint` and `audit`: INVALID_ARGUMENT unless 0 <= I < N <= kMaxParts
// (the tree's file groups bound N again when it is read).
absl::StatusOr<PartSpec> ParsePartSpec(const std::string& text);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_CLI_UTIL_H_
