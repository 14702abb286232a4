// `oci://` roots and sources of the CLI's audit (docs/interop.md, "OCI registries").
#ifndef CKPT_SERVICES_CLI_OCI_TREES_H_
#define CKPT_SERVICES_CLI_OCI_TREES_H_

#include "absl/status/status.h"
#include "core/audit/audit_checks.h"

namespace ckpt::cli {

// For a root or source that is an oci:// reference: opens the artifact (a tag resolved to its
// digest), reads the audit through it (root_dir / source_dir), binds its layer digests and
// manifest digest (root_binding / source_binding), and records the reference by digest as the
// model_ref / source_ref when none was given. Tar layers' files share the memory window's size
// as their budget. Paths that are not oci:// are left alone.
absl::Status OpenOciTrees(audit::AuditOptions* options);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_OCI_TREES_H_
