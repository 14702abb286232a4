// `ckpt-audit verify-chain DERIVED [--source S] --db LOG`: checks, offline, the chain
//
//   source bytes --(transcode, SLSA provenance)--> derived bytes --(passing pair audit)--> OK
//
// 1. the provenance statement (the file beside DERIVED, or the log's newest provenance naming
//    the derived OMS ROOT) is signed by a trusted key;
// 2. its subjects equal the derived tree on disk exactly (every file and the OMS ROOT);
// 3. with --source: its resolved dependencies equal the source tree on disk exactly;
// 4. the log holds an evidence record, signed by a trusted key and included under the log's
//    signed checkpoint, whose subjects equal the derived tree exactly, whose verdict is pass and
//    whose bound source (predicate.source: OMS ROOT and every file) is exactly the
//    provenance's source. Docs: docs/interop.md, "Provenance and verify-chain".
#ifndef CKPT_CORE_INTEROP_CHAIN_VERIFY_H_
#define CKPT_CORE_INTEROP_CHAIN_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/provenance.h"
#include "core/evidence/trust_store.h"
#include "core/progress.h"
#include "storage/evidence_log.h"

namespace ckpt::interop {

struct ChainOptions {
  std::string derived;
  std::string source;      // empty: the source is not on this machine
  std::string provenance;  // empty: DefaultProvenancePath(derived), else the log
  unsigned threads = 0;
};

struct ChainStep {
  bool ok = false;
  std::string what;
};

struct ChainReport {
  std::vector<ChainStep> steps;  // in the order checked
  std::optional<evidence::TranscodeProvenance> provenance;
  std::optional<uint64_t> provenance_id;  // when the provenance was read from the log
  std::optional<uint64_t> pair_audit_id;
  bool ok() const;
};

// Errors only when the inputs cannot be read at all (DERIVED missing, a provenance file that is
// not a signed statement, an unreadable log); every broken link is a failed step in the report.
absl::StatusOr<ChainReport> VerifyChain(const ChainOptions& options,
                                        const storage::EvidenceLog& log,
                                        const evidence::TrustStore& trust, Progress& progress);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_CHAIN_VERIFY_H_
