// `oci://` roots and sources of an audit, for the CLI's `audit` and the daemon's StartAudit
// alike (docs/interop.md, "OCI registries").
#ifndef CKPT_CORE_OCI_AUDIT_TREES_H_
#define CKPT_CORE_OCI_AUDIT_TREES_H_

#include "absl/status/status.h"
#include "core/audit/audit_checks.h"

namespace ckpt::oci {

// For a root or source that is an oci:// reference: opens the artifact (a tag resolved to its
// digest), reads the audit through it (root_dir / source_dir), binds its layer digests and
// manifest digest (root_binding / source_binding), names it by digest (root / source), and
// records that as the model_ref / source_ref when none was given. Tar layers' files share the
// memory window's size as their budget. Paths that are not oci:// are left alone. Credentials:
// the Docker config file of the process's user (core/oci/registry.h).
absl::Status OpenOciTrees(audit::AuditOptions* options);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_AUDIT_TREES_H_
