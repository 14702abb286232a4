// The audit pipeline (shared by the CLI and the daemon): every check this build supports, each turned into one
// evidence::CheckResult, assembled into an (unsigned) evidence record.
//
// Checks: `fingerprint` (file digests, OMS manifest ROOT: the record's subjects),
// `hf_layout` / `source_hf_layout` (a Hugging Face cache snapshot's or local-dir download's
// own names and etags against the digests read: core/audit/layout_check.h),
// `checkpoint_structure` (the strict reader and root rules), `scale_window` (the named policy),
// with a source checkpoint `pair_verify` (lossless re-encoding), and with a layer,
// `block_forward` (the CPU reference block on derived vs source). Adding a check means
// adding one adapter here; the record, signing and log do not change.
#ifndef CKPT_CORE_AUDIT_AUDIT_CHECKS_H_
#define CKPT_CORE_AUDIT_AUDIT_CHECKS_H_

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
#include "core/quant/pair_verify.h"
#include "core/quant/scale_window.h"

namespace ckpt::audit {

inline constexpr char kDefaultPolicy[] = "scale-window";

struct AuditOptions {
  std::string root;
  std::string source;  // empty: no pair audit
  // When set, the audit reads through these already-opened directories (the daemon opens and
  // checks a root when a job is submitted) and `root` / `source` are not resolved again.
  std::shared_ptr<const io::Directory> root_dir, source_dir;
  std::string policy = kDefaultPolicy;
  // Where an X4T container's declared checkpoint_root is mounted (docs/quant.md): the pair
  // check's format contract compares the mapped path with the root actually read.
  std::vector<quant::RootMapping> root_map;
  int forward_layer = -1;  // >= 0: run the block forward audit on this layer (CPU reference)
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

// The record's policy entry, and its subjects: every file digest plus the OMS manifest ROOT.
evidence::PolicyRef PolicyRefOf(const quant::ScaleWindowConfig& policy);
std::vector<evidence::Subject> SubjectsOf(const Fingerprint& fp);

evidence::CheckResult FingerprintCheck(const Fingerprint& fp);
evidence::CheckResult ScaleWindowCheck(const quant::ScaleWindowResult& r);
evidence::CheckResult PairCheck(const quant::PairVerifyResult& r);
evidence::CheckResult ForwardCheck(const forward::ForwardAuditResult& r);

// How an audit used storage and memory (not part of the record: it depends on timing).
struct AuditStats {
  uint64_t bytes_read = 0;       // from storage, both trees
  uint64_t peak_kept_bytes = 0;  // at most AuditOptions::memory_window
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
