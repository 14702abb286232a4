// `ckpt-audit audit ROOT`: runs every check this build supports, appends one signed evidence
// record and its in-toto test result to the log (core/interop/publish.h) and prints the verdict
// and the record id. Exit 0 pass, 1 fail, 2 error.
//
// Split across machines (docs/audit-parts.md): `audit ROOT --part I/N --part-key NODE.pem --out
// PART.json` runs one part and writes it signed (exit 0 once written, 2 on error, nothing
// written); `audit --merge PART.json... --part-trust NODE_KEYS --db --key` checks the parts and
// appends the one record, as `audit` does.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/audit/part_file.h"
#include "core/audit/parts.h"
#include "core/evidence/dsse.h"
#include "core/interop/publish.h"
#include "core/oci/audit_trees.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/forward_device.h"
#include "services/cli/log_heads.h"
#include "services/cli/read_file.h"
#include "services/cli/settings.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct AuditArgs {
  audit::AuditOptions options;
  std::string db;
  evidence::KeySource key;  // its PKCS#11 flags also serve --part-key
  std::string vsa;
  std::vector<std::string> map_root;
  std::string device = "cpu";  // of the block forward
  std::string emulate;
  bool json = false;
  std::string part;  // "I/N"
  std::string part_key, out;
  std::vector<std::string> merge;  // part files
  std::string part_trust;          // node keys: a trust file, never the record trust store
};

// One part: run, sign with the node key, write via a temporary file renamed into place.
int RunPart(const AuditArgs& a) {
  if (a.part_key.empty() || a.out.empty()) {
    return ReportError(absl::InvalidArgumentError("--part needs --part-key and --out"));
  }
  if (!a.db.empty() || !a.key.key.empty() || !a.vsa.empty()) {
    return ReportError(absl::InvalidArgumentError(
        "--part writes a part file, not a record: --db, --key and --vsa belong to --merge"));
  }
  auto spec = ParsePartSpec(a.part);
  if (!spec.ok()) return ReportError(spec.status());
  evidence::KeySource part_key = a.key;
  part_key.key = a.part_key;
  auto key = evidence::LoadSigningKey(part_key);
  if (!key.ok()) return ReportError(key.status());
  TerminalProgress progress;
  auto part = audit::RunAuditPart(a.options, *spec, progress);
  if (!part.ok()) return ReportError(part.status());
  auto envelope = audit::SignAuditPart(*part, *key);
  if (!envelope.ok()) return ReportError(envelope.status());
  if (absl::Status s = WriteFileAtomically(a.out, *envelope + "\n"); !s.ok()) {
    return ReportError(s);
  }
  if (a.json) {
    nlohmann::ordered_json j = {{"part", a.part},
                                {"verdict", part->verdict},
                                {"out", a.out},
                                {"keyid", key->public_key().KeyId()},
                                {"bytes_read", part->bytes_read}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("part %s: verdict %s of its units, %llu bytes read, written to %s\n",
                a.part.c_str(), part->verdict.c_str(),
                static_cast<unsigned long long>(part->bytes_read), a.out.c_str());
  }
  return kExitOk;
}

// The parts, each opened against the node keys.
absl::StatusOr<evidence::EvidenceRecord> Merge(const AuditArgs& a, Progress& progress) {
  if (a.part_trust.empty()) {
    return absl::InvalidArgumentError("--merge needs --part-trust (the node keys' trust file)");
  }
  auto trust = evidence::TrustStore::Load(a.part_trust);
  if (!trust.ok()) return trust.status();
  std::vector<audit::SignedPart> parts;
  for (const std::string& path : a.merge) {
    auto text = ReadSmallFile(path, 256u << 20);  // the strict JSON parser's limit
    if (!text.ok()) return text.status();
    auto part = audit::OpenAuditPart(*text, *trust, path);
    if (!part.ok()) return part.status();
    parts.push_back(*std::move(part));
  }
  return audit::MergeAuditParts(parts, progress, {a.options.threads, a.options.memory_window});
}

absl::Status WriteSummary(const evidence::EvidenceRecord& rec, const storage::EvidenceLog& log,
                          uint64_t record_id, const std::string& envelope,
                          const evidence::SigningKey& key, const std::string& path) {
  auto payload = evidence::VerificationSummaryPayload(
      rec, "https://ckpt-audit.dev/cli", interop::EntryUri(log, record_id),
      ToHex(Sha256Of(evidence::AsBytes(envelope))));
  if (!payload.ok()) return payload.status();
  auto envelope_text = evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, key);
  if (!envelope_text.ok()) return envelope_text.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << *envelope_text << "\n";
  if (!out) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

int Run(AuditArgs a) {
  const bool merging = !a.merge.empty();
  if (merging == !a.options.root.empty()) {
    return ReportError(absl::InvalidArgumentError(
        merging ? "--merge takes part files, not ROOT" : "ROOT is required"));
  }
  if (merging && (!a.options.source.empty() || !a.part.empty() || !a.map_root.empty() ||
                  !a.options.forward_layers.empty())) {
    return ReportError(absl::InvalidArgumentError(
        "--merge takes the audit's options from its parts: no --source, --part, --map-root or "
        "--forward-layers"));
  }
  if (!merging && !a.part_trust.empty()) {
    return ReportError(absl::InvalidArgumentError("--part-trust belongs to --merge"));
  }
  for (const std::string& spec : a.map_root) {
    absl::StatusOr<quant::RootMapping> m = quant::ParseRootMapping(spec);
    if (!m.ok()) return ReportError(m.status());
    a.options.root_map.push_back(*m);
  }
  if (a.options.forward_layers.empty() && (a.device != "cpu" || !a.emulate.empty())) {
    return ReportError(absl::InvalidArgumentError("--device and --emulate need --forward-layers"));
  }
  // Checked before anything is read: a GPU request without a GPU fails, never runs on the CPU.
  auto device = ForwardDeviceByName(a.device);
  if (!device.ok()) return ReportError(device.status());
  a.options.forward_device = *std::move(device);
  auto emulation = forward::ParseEmulation(a.emulate);
  if (!emulation.ok()) return ReportError(emulation.status());
  a.options.forward_emulation = *emulation;
  // oci://REGISTRY/REPO@sha256:... (or :TAG) as ROOT or --source (docs/interop.md).
  if (absl::Status s = oci::OpenOciTrees(&a.options); !s.ok()) return ReportError(s);
  if (!a.part.empty()) return RunPart(a);  // takes no log or key: flags only
  if (absl::Status s = ApplySetting(Setting::kDb, &a.db); !s.ok()) return ReportError(s);
  if (absl::Status s = ApplySetting(Setting::kKey, &a.key.key); !s.ok()) return ReportError(s);
  auto setup = ResolveEvidenceSetup(a.db, a.key);
  if (!setup.ok()) return ReportError(setup.status());
  if (!setup->defaults_note.empty()) {
    std::fprintf(stderr, "ckpt-audit: using the per-user %s\n", setup->defaults_note.c_str());
  }
  auto log = OpenLogWriter(setup->db_path);
  if (!log.ok()) return ReportError(log.status());
  TerminalProgress progress;
  auto rec = merging ? Merge(a, progress) : audit::RunAudit(a.options, progress);
  if (!rec.ok()) return ReportError(rec.status());
  auto published = interop::PublishAudit(*rec, setup->key, **log);
  if (!published.ok()) return ReportError(published.status());
  if (!a.vsa.empty()) {
    auto s = WriteSummary(*rec, **log, published->record_id, published->record_envelope,
                          setup->key, a.vsa);
    if (!s.ok()) return ReportError(s);
  }
  const storage::AppendResult& tree = published->last;
  std::string verdict = evidence::VerdictName(rec->OverallVerdict());
  if (a.json) {
    nlohmann::ordered_json j = {{"verdict", verdict},
                                {"record_id", published->record_id},
                                {"test_result_id", published->test_result_id},
                                {"db", setup->db_path},
                                {"keyid", setup->key.public_key().KeyId()},
                                {"tree_size", tree.tree_size},
                                {"tree_root", ToHex(tree.root)},
                                {"checks", nlohmann::ordered_json::array()}};
    for (const auto& c : rec->checks) {
      j["checks"].push_back({{"name", c.name}, {"verdict", evidence::VerdictName(c.verdict)}});
    }
    if (!rec->refs.model_ref.empty()) j["model_ref"] = rec->refs.model_ref;
    if (!rec->refs.source_ref.empty()) j["source_ref"] = rec->refs.source_ref;
    if (!rec->parts.empty()) j["parts"] = rec->parts.size();
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const auto& c : rec->checks) {
      std::printf("  %-22s %s", c.name.c_str(), evidence::VerdictName(c.verdict).c_str());
      const bool layout = absl::EndsWith(c.name, "hf_layout");  // docs/hf-layouts.md
      if (layout) std::printf(" (%s)", c.details.String("layout").c_str());
      // A failing check says why: its first findings and how many there are in all.
      if (layout || c.verdict == evidence::Verdict::kFail) {
        constexpr size_t kShown = 5;
        const uint64_t total = c.findings_total.value_or(c.findings.size());
        const size_t shown = std::min(c.findings.size(), kShown);
        for (size_t i = 0; i < shown; ++i) {
          std::printf("\n    %s: %s", c.findings[i].code.c_str(), c.findings[i].message.c_str());
        }
        if (total > shown) {
          std::printf("\n    ... %llu more (`audit --json` or `report` lists them)",
                      static_cast<unsigned long long>(total - shown));
        }
      }
      std::printf("\n");
    }
    if (!rec->refs.model_ref.empty()) std::printf("model ref %s\n", rec->refs.model_ref.c_str());
    if (!rec->refs.source_ref.empty()) std::printf("source ref %s\n", rec->refs.source_ref.c_str());
    std::printf("verdict %s: record %llu (test result %llu) in %s (tree size %llu)\n",
                verdict.c_str(), static_cast<unsigned long long>(published->record_id),
                static_cast<unsigned long long>(published->test_result_id),
                setup->db_path.c_str(), static_cast<unsigned long long>(tree.tree_size));
  }
  return rec->OverallVerdict() == evidence::Verdict::kFail ? kExitCheckFailed : kExitOk;
}

}  // namespace

void AddAuditCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "audit", "Run every check on a checkpoint and append one signed evidence record");
  auto a = std::make_shared<AuditArgs>();
  AcceptHubRepoIds(
      cmd->add_option(
          "ROOT", a->options.root,
          "checkpoint root, or oci://REGISTRY/REPO@sha256:HEX (or :TAG) (not with --merge)"));
  AcceptHubRepoIds(cmd->add_option("--source", a->options.source,
                                   "source checkpoint (a directory or oci://...) for a pair audit"));
  cmd->add_option("--policy", a->options.policy, "policy name (scale-window, marlin-safe)");
  cmd->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  cmd->add_option(
      "--key", a->key.key,
      "signing key PEM or pkcs11:URI (default: $CKPT_AUDIT_KEY, then the config file, then "
      "per-user, generated)");
  AddPkcs11Flags(cmd, &a->key);
  cmd->add_option("--vsa", a->vsa, "also write a signed SLSA verification summary here");
  cmd->add_option("--forward-layers,--forward-layer", a->options.forward_layers,
                  "also run the block forward on these MoE layers (all or L1,L2,...; vs --source)");
  cmd->add_option("--device", a->device, "device of the block forward: cpu (default) or cuda");
  cmd->add_option("--emulate", a->emulate,
                  "also run the block forward as a backend loads it: vllm-w13-collapse");
  AddThreadsOption(cmd, &a->options.threads);
  AddMemoryWindowFlag(cmd, &a->options.memory_window);
  cmd->add_option("--model-ref", a->options.refs.model_ref,
                  "recorded as given: where ROOT came from, e.g. a repo@revision (default: "
                  "the repo and commit of a Hugging Face cache snapshot or local-dir)");
  cmd->add_option("--source-ref", a->options.refs.source_ref,
                  "recorded as given: where --source came from (default: as --model-ref)");
  cmd->add_option("--image-digest", a->options.refs.image_digest,
                  "recorded as given: the container image this audit runs in");
  cmd->add_option("--invoker", a->options.invoker,
                  "recorded as given: who asked for this audit (ckpt-auditd's Slurm parts pass "
                  "its caller)");
  cmd->add_option("--links-allowed", a->options.links.allowed,
                  "every link target must lie under one of these directories (repeatable; "
                  "ckpt-auditd's Slurm parts pass its --allow-root)");
  cmd->add_option("--map-root", a->map_root,
                  "/DECLARED=/ACTUAL: where an X4T checkpoint_root is mounted now");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->add_option("--part", a->part,
                  "run only part I/N of the audit and write it signed to --out (docs/audit-parts.md)");
  cmd->add_option("--part-key", a->part_key,
                  "the node's Ed25519 key (PEM or pkcs11:URI) that signs the part");
  cmd->add_option("--out", a->out, "where --part writes its signed part file");
  cmd->add_option("--merge", a->merge,
                  "merge these part files into one record (with --part-trust, --db, --key)")
      ->excludes("--part");
  cmd->add_option("--part-trust", a->part_trust,
                  "trust file of the node keys that may sign parts (never the record trust store)");
  AddLinkFlags(cmd, &a->options.links);
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
