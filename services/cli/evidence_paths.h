// Where the CLI keeps evidence when the user names nothing: a per-user database, signing key
// and trust file under $XDG_DATA_HOME/ckpt-audit (default ~/.local/share/ckpt-audit); and what
// it remembers about the logs it read under $XDG_STATE_HOME/ckpt-audit (default
// ~/.local/state/ckpt-audit).
#ifndef CKPT_SERVICES_CLI_EVIDENCE_PATHS_H_
#define CKPT_SERVICES_CLI_EVIDENCE_PATHS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/key_source.h"
#include "core/evidence/trust_store.h"

namespace ckpt::cli {

// The per-user directory (created 0700 on first use).
absl::StatusOr<std::string> EvidenceHome();

// The per-user state directory (created 0700 on first use).
absl::StatusOr<std::string> StateHome();

// The per-user signing key's path (it may not exist yet).
absl::StatusOr<std::string> DefaultKeyPath();

struct EvidenceSetup {
  std::string db_path;
  std::string key_path;  // or the key's pkcs11: URI
  evidence::SigningKey key;
  std::string defaults_note;  // what defaults were used, for one line on stderr; empty if none
};

// Resolves --db and --key (a PEM file or a token key, core/evidence/key_source.h): an empty value
// means the per-user default. A missing default key is generated (0600) and added to the default
// trust file.
absl::StatusOr<EvidenceSetup> ResolveEvidenceSetup(const std::string& db,
                                                   const evidence::KeySource& key);

// The callback of a command that reads a log: `run`, after an empty `*db` became the log
// CKPT_AUDIT_DB or the config file names (services/cli/settings.h), else the per-user log (the
// one `audit` writes by default), so every command finds the same log without --db.
std::function<void()> WithDefaultDb(std::string* db, int* exit_code, std::function<int()> run);

// --trust FILE, or the per-user trust file when empty.
absl::StatusOr<evidence::TrustStore> LoadTrust(const std::string& trust_path);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_EVIDENCE_PATHS_H_
