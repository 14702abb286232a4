// ckpt-audit: the command-line interface for people and CI. See README.md for the commands.
#include "CLI/CLI.hpp"
#include "core/evidence/environment.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ckpt-audit: prove things about quantized LLM checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", ckpt::evidence::VersionText("ckpt-audit"));
  int exit_code = ckpt::cli::kExitOk;
  ckpt::cli::AddInspectCommand(app, &exit_code);
  ckpt::cli::AddFingerprintCommand(app, &exit_code);
  ckpt::cli::AddForwardCommand(app, &exit_code);
  ckpt::cli::AddDiffCommand(app, &exit_code);
  ckpt::cli::AddQuantCheckCommand(app, &exit_code);
  ckpt::cli::AddRulesCommand(app, &exit_code);
  ckpt::cli::AddTranscodeCommand(app, &exit_code);
  ckpt::cli::AddVerifyPairCommand(app, &exit_code);
  ckpt::cli::AddKeysCommand(app, &exit_code);
  ckpt::cli::AddAuditCommand(app, &exit_code);
  ckpt::cli::AddVerifyCommands(app, &exit_code);
  ckpt::cli::AddQueryCommand(app, &exit_code);
  ckpt::cli::AddReportCommand(app, &exit_code);
  ckpt::cli::AddRemoteCommands(app, &exit_code);
  ckpt::cli::AddSignCommand(app, &exit_code);
  ckpt::cli::AddVerifySignatureCommand(app, &exit_code);
  ckpt::cli::AddProofCommands(app, &exit_code);
  ckpt::cli::AddExportCommand(app, &exit_code);
  ckpt::cli::AddOciCommands(app, &exit_code);
  ckpt::cli::AddVerifyChainCommand(app, &exit_code);
  ckpt::cli::AddTokensCommand(app, &exit_code);
  ckpt::cli::AddConfigCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : ckpt::cli::kExitError;
  }
  return exit_code;
}
