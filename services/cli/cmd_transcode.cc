// `ckpt-audit transcode --to nvfp4 [--layout compressed-tensors|modelopt] SRC DST`: lossless
// MXFP4 -> NVFP4A16, written in compressed-tensors' layout (the default) or ModelOpt's
// (W4A16_NVFP4; a gpt-oss MXFP4 source only to ModelOpt's gpt-oss layout), or a failure naming
// every over-span tensor/row/group (nothing published). The
// source streams through --memory-window; an interrupted run is continued with --resume
// (core/quant/transcode.h). A finished transcode also writes a signed SLSA Provenance v1
// statement beside DST (DST.intoto.jsonl, or --provenance FILE) naming the
// derived files and the source files by digest, and appends it to the log with --db
// (core/interop/transcode_provenance.h). Exit 0 written, 1 policy refused the source, 2 invalid
// input or error.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/dsse.h"
#include "core/interop/transcode_provenance.h"
#include "core/io/tree_stream.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"
#include "services/cli/read_file.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct TranscodeArgs {
  std::string to = "nvfp4";
  std::string layout = "compressed-tensors";
  std::string src, dst;
  std::string policy = audit::kDefaultPolicy;
  std::string source_ref;
  std::string provenance;
  std::string db;
  evidence::KeySource key;
  bool json = false;
  bool resume = false;
  unsigned threads = 0;
  uint64_t memory_window = kDefaultMemoryWindow;
};

int Run(const TranscodeArgs& a) {
  if (a.to != "nvfp4") {
    return ReportError(absl::InvalidArgumentError("--to: only nvfp4 is supported"));
  }
  auto layout = quant::ParseTranscodeLayout(a.layout);
  if (!layout.ok()) return ReportError(layout.status());
  auto policy = audit::PolicyByName(a.policy);
  if (!policy.ok()) return ReportError(policy.status());
  const std::string provenance_path =
      a.provenance.empty() ? interop::DefaultProvenancePath(a.dst) : a.provenance;
  std::error_code ec;
  if (std::filesystem::exists(provenance_path, ec)) {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat(provenance_path, ": already exists; not overwriting")));
  }
  auto setup = ResolveEvidenceSetup(a.db, a.key);  // before any work: a bad key stops here
  if (!setup.ok()) return ReportError(setup.status());
  if (a.key.key.empty()) {
    std::fprintf(stderr, "ckpt-audit: provenance signed with the per-user key %s\n",
                 setup->key_path.c_str());
  }
  quant::TranscodeOptions options;
  options.layout = *layout;
  options.threads = a.threads;
  options.policy = *policy;
  options.memory_window = a.memory_window;
  options.resume = a.resume;
  TerminalProgress progress;
  auto r = interop::TranscodeWithProvenance(a.src, a.dst, options, a.source_ref, progress);
  if (!r.ok()) {
    ReportError(r.status());
    return r.status().code() == absl::StatusCode::kFailedPrecondition ? kExitCheckFailed
                                                                      : kExitError;
  }
  auto payload = evidence::ProvenancePayload(r->provenance);
  if (!payload.ok()) return ReportError(payload.status());
  auto signed_envelope =
      evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, setup->key);
  if (!signed_envelope.ok()) return ReportError(signed_envelope.status());
  const std::string& envelope = *signed_envelope;
  if (auto s = WriteFileAtomically(provenance_path, envelope + "\n"); !s.ok()) {
    return ReportError(s);
  }
  std::optional<uint64_t> logged;
  if (!a.db.empty()) {
    auto log = OpenLogWriter(a.db);
    if (!log.ok()) return ReportError(log.status());
    auto appended = (*log)->Append(envelope, setup->key);
    if (!appended.ok()) return ReportError(appended.status());
    logged = appended->seq;
  }
  const quant::TranscodeResult& t = r->result;
  if (a.json) {
    nlohmann::json j = t.ToJson();
    j["source"] = r->provenance.source_path;
    j["destination"] = r->provenance.output_path;
    j["provenance"] = provenance_path;
    if (logged) j["provenance_record_id"] = *logged;
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("wrote %s (%s layout): %llu tensors in %zu files (%s), %llu modules transcoded "
                "losslessly, %llu all-zero groups canonicalized to scale %s (policy %s)\n",
                a.dst.c_str(), quant::TranscodeLayoutName(t.layout).c_str(),
                static_cast<unsigned long long>(t.tensors_written), t.files.size(),
                HumanBytes(t.bytes_written).c_str(),
                static_cast<unsigned long long>(t.modules_transcoded),
                static_cast<unsigned long long>(t.zero_groups_canonicalized),
                t.zero_group_scale.c_str(),
                t.policy.config.id().c_str());
    if (a.resume) {
      std::printf("resumed: %llu output shard(s) of the interrupted run kept, %llu redone\n",
                  static_cast<unsigned long long>(t.shards_kept),
                  static_cast<unsigned long long>(t.shards_redone));
    }
    std::printf("provenance %s%s\n", provenance_path.c_str(),
                logged ? absl::StrCat(" (record ", *logged, " in ", a.db, ")").c_str() : "");
  }
  return kExitOk;
}

}  // namespace

void AddTranscodeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "transcode", "Losslessly transcode an MXFP4 checkpoint to NVFP4A16 (never requantizes)");
  auto a = std::make_shared<TranscodeArgs>();
  cmd->add_option("--to", a->to, "target format (nvfp4)")->required();
  cmd->add_option("--layout", a->layout,
                  "compressed-tensors (default) or modelopt (ModelOpt W4A16_NVFP4 names, "
                  "weight_scale_2 and hf_quant_config.json)");
  AcceptHubRepoIds(
      cmd->add_option("SRC", a->src,
                      "compressed-tensors or gpt-oss (--layout modelopt) MXFP4 checkpoint root"))
      ->required();
  cmd->add_option("DST", a->dst, "output directory (must not exist)")->required();
  cmd->add_option("--policy", a->policy, "scale-window (default) or marlin-safe");
  cmd->add_option("--source-ref", a->source_ref,
                  "where the source came from (e.g. hf://org/model@revision), recorded");
  cmd->add_option("--provenance", a->provenance, "provenance file (default DST.intoto.jsonl)");
  cmd->add_option("--db", a->db, "also append the provenance to this evidence log");
  cmd->add_option("--key", a->key.key,
                  "signing key PEM or pkcs11:URI (default: per-user, generated)");
  AddPkcs11Flags(cmd, &a->key);
  cmd->add_flag("--json", a->json, "machine-readable output");
  AddThreadsOption(cmd, &a->threads);
  AddMemoryWindowFlag(cmd, &a->memory_window);
  cmd->add_flag("--resume", a->resume,
                "continue an interrupted transcode to DST: its finished shards are checked "
                "against the source byte for byte and kept, the rest redone");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
