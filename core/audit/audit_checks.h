// The audit (shared by the CLI and the daemon): every check this build supports, run by the one
// engine (core/audit/engine.h), each turned into one evidence::CheckResult, assembled into an
// (unsigned) evidence record.
//
// Checks: `fingerprint` (file digests, OMS manifest ROOT: the record's subjects),
// `hf_layout` / `source_hf_layout` (a Hugging Face cache snapshot's or local-dir download's
// own names and etags against the digests read: core/audit/layout_check.h),
// `checkpoint_structure` (the strict reader and root rules), `scale_window` (the named policy:
// scale_window_check.h), with a source checkpoint `pair_verify` (lossless re-encoding:
// pair_check.h), and with forward layers, `block_forward` (the block forward of those layers on
// derived vs source, on the device the caller chose: forward_check.h). Adding a check means a
// Check of its own file and its record form; the record, signing and log do not change.
#ifndef CKPT_CORE_AUDIT_AUDIT_CHECKS_H_
#define CKPT_CORE_AUDIT_AUDIT_CHECKS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/record.h"
#include "core/fingerprint/fingerprint.h"
#include "core/io/hf_layout.h"
#include "core/io/tree_image.h"
#include "core/forward/forward_audit.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "core/quant/scale_window.h"

namespace ckpt::audit {

inline constexpr char kDefaultPolicy[] = "scale-window";

// A tree read from elsewhere than a file system: an OCI artifact (core/oci/artifact.h,
// docs/interop.md "OCI registries"). Its manifest digest becomes the record's typed
// `oci_manifest` (for a source: the source binding's) and joins the subjects under
// evidence::kOciManifestSubject beside the file digests and the OMS ROOT; and each named file's
// SHA-256, taken by the engine from the bytes it read, must be the one given (a raw layer's
// digest): DATA_LOSS naming the file otherwise, and nothing is signed.
struct ReadBinding {
  std::string manifest_digest;                     // "sha256:HEX"
  std::map<std::string, std::string> file_sha256;  // recorded name -> lowercase hex
};

struct AuditOptions {
  std::string root;
  std::string source;  // empty: no pair audit
  // When set, the audit reads through these already-opened directories (the daemon opens and
  // checks a root when a job is submitted) and `root` / `source` are not resolved again.
  std::shared_ptr<const io::Directory> root_dir, source_dir;
  std::optional<ReadBinding> root_binding, source_binding;
  std::string policy = kDefaultPolicy;
  // Where an X4T container's declared checkpoint_root is mounted (docs/quant.md): the pair
  // check's format contract compares the mapped path with the root actually read.
  std::vector<quant::RootMapping> root_map;
  // "all" or "L1,L2,...": run the block forward on these MoE layers (docs/forward.md); empty:
  // none. The device is the caller's (the CLI and the daemon pick CPU or CUDA); a GPU's
  // properties go into the record's environment. f64 on the CPU, bf16 on a GPU.
  std::string forward_layers;
  forward::ForwardDevice forward_device = forward::CpuDevice();
  // kNone: the vLLM w1/w3 collapse is measured anyway (forward_audit.h Emulation).
  forward::Emulation forward_emulation = forward::Emulation::kNone;
  unsigned threads = 0;
  // Bytes kept in memory at once: small files, headers and the tensors checks wait for
  // (core/io/tree_stream.h), whatever the size of the trees.
  uint64_t memory_window = kDefaultMemoryWindow;
  LinkOptions links;  // generic trees; hub snapshots and local-dirs: docs/hf-layouts.md
  // Recorded as given; an empty model_ref / source_ref is filled from a Hugging Face layout.
  evidence::ExternalRefs refs;
  std::string invoker;
};

// Policies by name: "scale-window" (max span 17, exactly what E4M3 represents) and
// "marlin-safe" (max span 14, so Marlin's scale folding cannot lose precision).
absl::StatusOr<quant::ScaleWindowConfig> PolicyByName(const std::string& name);
std::vector<std::string> PolicyNames();

// The record's policy entry, and its subjects: every file digest plus the OMS manifest ROOT;
// INVALID_ARGUMENT for a file named like a subject that names no file
// (evidence::CheckFileSubjectName).
evidence::PolicyRef PolicyRefOf(const quant::ScaleWindowConfig& policy);
absl::StatusOr<std::vector<evidence::Subject>> SubjectsOf(const Fingerprint& fp);

// The record's fingerprint check (each other check's record form is in its own file).
evidence::CheckResult RecordOf(const Fingerprint& fp);

// How an audit used storage and memory (not part of the record: it depends on timing).
struct AuditStats {
  uint64_t bytes_read = 0;       // from storage, both trees, re-reads included
  uint64_t peak_kept_bytes = 0;  // at most AuditOptions::memory_window
  uint64_t reread_tensors = 0, reread_bytes = 0;  // StreamResult's
};

// One read of the root (and of the source), streamed in a bounded memory window, feeds every
// check: the record's digests are the digests of the bytes the verdicts were computed from
// (docs/audit-engine.md). Errors only when the audit cannot run at all (missing root, unknown
// policy, a layout that does not fit the memory window: RESOURCE_EXHAUSTED), when it is
// cancelled (CANCELLED), or when a file changed, shrank or could not be read during the audit
// (DATA_LOSS): nothing may be signed then. A checkpoint that breaks the rules gives a record
// with failing checks.
absl::StatusOr<evidence::EvidenceRecord> RunAudit(const AuditOptions& options,
                                                  Progress& progress,
                                                  AuditStats* stats = nullptr);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_AUDIT_CHECKS_H_
