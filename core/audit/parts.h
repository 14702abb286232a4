// An audit split across machines (docs/audit-parts.md): each node runs one part, a balanced
// share of the checks' units, hashing its own share of the files whole and reading only the
// tensors its units need from the others; the merge checks the parts against each other and
// assembles the record the single-machine audit gives (core/audit/audit_run.h).
//
// Assignment (the same on every node, from the listing and the headers alone): every root file
// is a group; a source file joins the root file whose units need most of its bytes (or stays a
// group of its own); groups go largest first to the least-loaded part (AssignLargestFirst,
// core/fingerprint/partition.h), and a group's part hashes its files. A unit goes with the root
// file holding most of its bytes, so a module's units on both trees (scale window, pair) stay
// together and mostly read files their own part hashes.
#ifndef CKPT_CORE_AUDIT_PARTS_H_
#define CKPT_CORE_AUDIT_PARTS_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/audit/audit_checks.h"
#include "core/audit/engine.h"
#include "core/evidence/environment.h"
#include "core/evidence/record.h"
#include "core/fingerprint/fingerprint.h"
#include "core/git_blob_sha1.h"
#include "core/quant/pair_verify.h"
#include "core/quant/scale_window.h"
#include "core/sha256.h"

namespace ckpt::audit {

// The audit options every part of one audit must share: those that shape the record (threads
// and the memory window do not, and may differ from node to node).
struct PartOptions {
  std::string root, source;  // as given on the command line
  std::string policy;
  std::vector<std::string> root_map;  // "DECLARED=ACTUAL"
  std::string model_ref, source_ref, image_digest, invoker;
  bool allow_symlinks = false;
  std::vector<std::string> confine, allowed;

  bool operator==(const PartOptions&) const = default;
};
PartOptions PartOptionsOf(const AuditOptions& options);
// The audit options the merge reopens the trees with. INVALID_ARGUMENT for a bad root mapping.
absl::StatusOr<AuditOptions> AuditOptionsOf(const PartOptions& options);

// A tensor's bytes: [begin, end) in its file, and their SHA-256.
struct PartTensor {
  std::string name;
  uint64_t begin = 0, end = 0;
  Digest sha256{};
};

// One file of either tree as a part saw it.
struct PartFile {
  unsigned tree = 0;  // 0: the audited root, 1: the source
  std::string name;   // recorded name
  uint64_t size = 0;
  // The SHA-256 of what every part reads of it before streaming: the whole file when it is
  // read whole, else a safetensors file's length prefix and header.
  Digest seen{};
  bool hashed = false;  // this part hashed the whole file: the rest is set
  std::optional<Digest> sha256;
  std::optional<GitObjectId> git_blob_id;  // when the layout names the file by it
  std::vector<PartTensor> tensors;         // every tensor, in header order
};

// A tensor a part read from a file another part hashes.
struct PartRange {
  unsigned tree = 0;
  std::string file;
  PartTensor tensor;
};

struct WindowUnitResult {
  size_t unit = 0;   // index among the scale-window check's units
  std::string name;  // its fused group
  std::vector<quant::ScaleWindowMemberResult> members;
};

struct PairUnitResult {
  size_t unit = 0;   // index among the pair check's units
  std::string name;  // the module or tensor
  quant::PairUnitOutcome outcome;
};

// What one part signs.
struct AuditPart {
  PartSpec spec;
  PartOptions options;
  evidence::Environment environment;  // tool version and commit, host
  std::string root_seen, source_seen;  // the roots' real paths on this node
  std::string started_at, finished_at;
  uint64_t bytes_read = 0;  // from storage, both trees
  std::vector<PartFile> files;  // every file of both trees, root first, in listing order
  std::vector<PartRange> ranges;
  std::vector<WindowUnitResult> window_units;
  std::vector<PairUnitResult> pair_units;
  // "fail" when a unit this part ran found something, else "pass"; the audit's verdict is
  // the merged record's.
  std::string verdict;
};

// Which part hashes each file and runs each unit key, for `count` parts of the trees in
// `images` (root first) with the units of `plan`.
struct PartAssignment {
  std::vector<std::map<std::string, unsigned>> file_part;  // by tree, by file name
  std::map<std::string, unsigned> key_part;                // by WorkPlan key
  size_t groups = 0;  // the file groups shared out: one per root file, plus unpaired sources
};
PartAssignment AssignParts(const std::vector<std::shared_ptr<const TreeImage>>& images,
                           const WorkPlan& plan, unsigned count);

// Runs part `spec` of the audit. Errors: RunAudit's; FAILED_PRECONDITION with forward layers
// (the block forward's units depend on each other and are not split).
absl::StatusOr<AuditPart> RunAuditPart(const AuditOptions& options, const PartSpec& spec,
                                       Progress& progress, AuditStats* stats = nullptr);

// A part as the merge received it: the part, the key id that signed it, the SHA-256 of its
// envelope, and where it came from (named in refusals).
struct SignedPart {
  AuditPart part;
  std::string signer;
  Digest digest{};
  std::string label;
};

// The record of the whole audit from all its parts, or FAILED_PRECONDITION naming why the
// parts cannot be merged: a part missing or given twice, parts of different splits, options or
// tool versions; a file or unit in no part or in two; a file that differs from what another
// part (or the merge, which reads every header again) saw; a tensor range whose digest differs
// from the one the part that hashed the file took (naming the file, the tensor and both parts).
// The trees' headers are read again (not their tensor data) from the roots as the parts were
// given them, or through `root_dir` / `source_dir` when set (the directories the daemon opened
// and checked when the audit was started), with the merge's own threads and memory window;
// errors of that read as RunAudit's. Every part must have read the trees the merge opened: a
// part whose `root_seen` / `source_seen` is not the real path the merge opened is refused,
// naming it (docs/audit-parts.md, "What a part trusts").
struct MergeOptions {
  unsigned threads = 0;
  uint64_t memory_window = kDefaultMemoryWindow;
  std::shared_ptr<const io::Directory> root_dir, source_dir;
};
absl::StatusOr<evidence::EvidenceRecord> MergeAuditParts(const std::vector<SignedPart>& parts,
                                                         Progress& progress,
                                                         const MergeOptions& merge = {});

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_PARTS_H_
