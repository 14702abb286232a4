// The `hf_layout` check (and `source_hf_layout` for a pair's source): what a Hugging Face cache
// snapshot or local-dir download says about its own files, compared with the digests of the
// audit's one read (docs/hf-layouts.md). Only recorded for those layouts.
#ifndef CKPT_CORE_AUDIT_LAYOUT_CHECK_H_
#define CKPT_CORE_AUDIT_LAYOUT_CHECK_H_

#include <string>

#include "core/evidence/record.h"
#include "core/io/hf_layout.h"
#include "core/io/tree_image.h"

namespace ckpt::audit {

// Fails when any finding fails (a blob or file whose content is not what its name or etag
// says, a download that mixes commits); details carry the layout, repo, commit and model ref.
evidence::CheckResult LayoutCheck(const std::string& name, const LayoutInfo& layout,
                                  const TreeImage& image);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_LAYOUT_CHECK_H_
