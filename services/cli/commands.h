// The `ckpt-audit` subcommands. Each Add*Command registers one CLI11 subcommand whose callback
// stores the process exit code in `*exit_code`: 0 ok, 1 a check failed, 2 invalid input or error.
#ifndef CKPT_SERVICES_CLI_COMMANDS_H_
#define CKPT_SERVICES_CLI_COMMANDS_H_

#include "CLI/CLI.hpp"
#include "core/io/hf_layout.h"

namespace ckpt::cli {

void AddInspectCommand(CLI::App& app, int* exit_code);
void AddFingerprintCommand(CLI::App& app, int* exit_code);
void AddForwardCommand(CLI::App& app, int* exit_code);
void AddDiffCommand(CLI::App& app, int* exit_code);
void AddQuantCheckCommand(CLI::App& app, int* exit_code);
void AddRulesCommand(CLI::App& app, int* exit_code);  // the rule catalog (docs/rules.md)
void AddTranscodeCommand(CLI::App& app, int* exit_code);
void AddVerifyPairCommand(CLI::App& app, int* exit_code);
void AddKeysCommand(CLI::App& app, int* exit_code);
void AddAuditCommand(CLI::App& app, int* exit_code);
void AddVerifyCommands(CLI::App& app, int* exit_code);  // verify, verify-log
void AddQueryCommand(CLI::App& app, int* exit_code);
void AddReportCommand(CLI::App& app, int* exit_code);
void AddRemoteCommands(CLI::App& app, int* exit_code);  // submit, gate (ckpt-auditd)
// The ecosystem's formats (docs/interop.md).
void AddSignCommand(CLI::App& app, int* exit_code);
void AddVerifySignatureCommand(CLI::App& app, int* exit_code);
void AddProofCommands(CLI::App& app, int* exit_code);  // proof, verify-proof
void AddExportCommand(CLI::App& app, int* exit_code);
void AddVerifyChainCommand(CLI::App& app, int* exit_code);
void AddTokensCommand(CLI::App& app, int* exit_code);   // tokens add (ckpt-auditd --tokens)
void AddOciCommands(CLI::App& app, int* exit_code);     // attach, verify-oci
void AddConfigCommand(CLI::App& app, int* exit_code);   // services/cli/settings.h

// `--allow-symlinks` and `--confine DIR` (docs/hf-layouts.md), stored in `*links`.
void AddLinkFlags(CLI::App* cmd, LinkOptions* links);
// A checkpoint argument (ROOT, --source, ...) that names nothing here but has the shape of a
// Hugging Face repo id, ORG/NAME[@REVISION], becomes the path of the snapshot the hub cache
// holds for it (core/io/hf_layout.h FindHubSnapshot), the cache found as the hf tool finds it:
// $HF_HUB_CACHE (or its older name $HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. The resolution is said on
// stderr; the snapshot's commit, not the revision's name (a branch moves), is what a record
// names (docs/hf-layouts.md "Repo ids"). A repo id the cache does not hold is a usage error
// saying what is missing.
CLI::Option* AcceptHubRepoIds(CLI::Option* option);
// `--threads N` into `threads`: 0 (all cores) to kMaxThreads (core/parallel.h); more is a usage
// error naming the flag and the limit, never an attempt to start them.
void AddThreadsOption(CLI::App* cmd, unsigned* threads);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_COMMANDS_H_
