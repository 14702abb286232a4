// Settings a user gives once instead of on every command (README "Defaults"). Each comes from
// its flag, else its environment variable, else the per-user config file, else the command's
// own default; `ckpt-audit config` shows what each resolves to and from where.
//
// The config file is $XDG_CONFIG_HOME/ckpt-audit/config (default ~/.config/ckpt-audit/config):
// `NAME = VALUE` lines, blank lines and comments (from a `#` at the start of a line or after
// white space). It decides which log and key a command uses, so it is read only when the file
// it names (a link is followed) is a regular file owned by root or this user and writable by no
// one else; a line that is not a known setting, a setting given twice, a control character and
// a path that is not absolute are errors naming the file and the line.
#ifndef CKPT_SERVICES_CLI_SETTINGS_H_
#define CKPT_SERVICES_CLI_SETTINGS_H_

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::cli {

enum class Setting {
  kDb,         // --db, CKPT_AUDIT_DB, db: the evidence log
  kKey,        // --key (audit, attach), CKPT_AUDIT_KEY, key: the signing key (PEM or pkcs11:)
  kServer,     // --server (submit, gate), CKPT_AUDIT_SERVER, server: the daemon's address
  kTokenFile,  // --token-file (submit, gate), token-file; CKPT_AUDIT_TOKEN holds a token instead
};

inline constexpr char kDefaultServer[] = "127.0.0.1:7433";

struct SettingValue {
  std::string value;   // empty: given nowhere (the command's default applies)
  std::string source;  // "flag", "CKPT_AUDIT_DB", "CONFIG_FILE:LINE"; empty when not given
};

// `flag` when not empty, else the environment variable, else the config file's line (for
// kTokenFile: none while CKPT_AUDIT_TOKEN is set, since the environment outranks the file).
// INVALID_ARGUMENT or FAILED_PRECONDITION for a config file that cannot be used.
absl::StatusOr<SettingValue> ResolveSetting(Setting setting, const std::string& flag);
// `*value` (a flag's) replaced by ResolveSetting's value; it stays empty when given nowhere.
absl::Status ApplySetting(Setting setting, std::string* value);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_SETTINGS_H_
