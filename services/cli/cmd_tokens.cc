// `ckpt-audit tokens add --file FILE --role ROLE --name NAME`: creates a random 256-bit bearer
// token for ckpt-auditd, appends only its SHA-256 hash (with the role and name) to the token
// file (created 0600), and prints the token once on stdout. Format: docs/daemon.md.
#include <cstdio>
#include <memory>

#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/daemon/auth.h"

namespace ckpt::cli {
namespace {

struct TokenArgs {
  std::string file, role, name;
};

int Add(const TokenArgs& a) {
  auto role = daemon::ParseRole(a.role);
  if (!role.ok()) return ReportError(role.status());
  auto token = daemon::NewToken();
  if (!token.ok()) return ReportError(token.status());
  if (absl::Status s = daemon::AppendToken(a.file, *token, *role, a.name); !s.ok()) {
    return ReportError(s);
  }
  std::printf("%s\n", token->c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "added token '%s' (role %s) to %s; only its hash is stored, so keep the token "
               "printed above. ckpt-auditd reads the file when it starts.\n",
               a.name.c_str(), a.role.c_str(), a.file.c_str());
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
  add->callback([=] { *exit_code = Add(*args); });
}

}  // namespace ckpt::cli
