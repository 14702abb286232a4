// `ckpt-audit tokens add --file FILE --role ROLE --name NAME [--out TOKEN_FILE]`: creates a
// random 256-bit bearer token for ckpt-auditd, appends only its SHA-256 hash (with the role and
// name) to the token file (created 0600), and gives the token once: on stdout, or in a new file
// `--out` created 0600, as `submit --token-file` requires. Format: docs/daemon.md.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "core/evidence/key_file.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/daemon/auth.h"

namespace ckpt::cli {
namespace {

struct TokenArgs {
  std::string file, role, name, out;
};

int Add(const TokenArgs& a) {
  auto role = daemon::ParseRole(a.role);
  if (!role.ok()) return ReportError(role.status());
  auto token = daemon::NewToken();
  if (!token.ok()) return ReportError(token.status());
  // The token's own file first (a secret, written as a private key is: new, 0600), so that an
  // existing one refuses the add before the daemon's file holds a hash nobody has the token of.
  if (!a.out.empty()) {
    if (absl::Status s = evidence::WritePrivateKeyFile(a.out, *token + "\n"); !s.ok()) {
      return ReportError(s);
    }
  }
  if (absl::Status s = daemon::AppendToken(a.file, *token, *role, a.name); !s.ok()) {
    if (!a.out.empty()) ::unlink(a.out.c_str());
    return ReportError(s);
  }
  if (a.out.empty()) {
    std::printf("%s\n", token->c_str());
    std::fflush(stdout);
  }
  const std::string kept =
      a.out.empty() ? "printed above" : absl::StrCat("in ", a.out, " (mode 0600)");
  std::fprintf(stderr,
               "added token '%s' (role %s) to %s; only its hash is stored, so keep the token "
               "%s. ckpt-auditd reads the file when it starts.\n",
               a.name.c_str(), a.role.c_str(), a.file.c_str(), kept.c_str());
  return kExitOk;
}

}  // namespace

void AddTokensCommand(CLI::App& app, int* exit_code) {
  auto* tokens = app.add_subcommand("tokens", "Manage ckpt-auditd bearer tokens");
  tokens->require_subcommand(1);
  auto args = std::make_shared<TokenArgs>();
  auto* add = tokens->add_subcommand(
      "add", "Create a token: its hash goes to --file, the token itself to stdout (once)");
  add->add_option("--file", args->file, "token file of ckpt-auditd --tokens")->required();
  add->add_option("--role", args->role, "reader, auditor, gate or admin")->required();
  add->add_option("--name", args->name,
                  "who holds it (1-64 of A-Z a-z 0-9 . _ @ -), recorded in evidence")
      ->required();
  add->add_option("--out", args->out,
                  "write the token to this new file (mode 0600, never overwritten), for "
                  "`submit --token-file`, instead of to stdout");
  add->callback([=] { *exit_code = Add(*args); });
}

}  // namespace ckpt::cli
