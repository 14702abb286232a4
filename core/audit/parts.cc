#include "core/audit/parts.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/audit/audit_run.h"
#include "core/fingerprint/partition.h"
#include "core/text/name_encoding.h"

namespace ckpt::audit {
namespace {

const char* TreeName(unsigned tree) { return tree == 0 ? "root" : "source"; }

// "FILE (part I/N)": a part as refusals name it.
std::string Named(const SignedPart& p) {
  return absl::StrCat(p.label, " (part ", p.part.spec.index, "/", p.part.spec.count, ")");
}

// Where each file of the images holding a safetensors header is: (tree, index in its files).
std::map<const SafetensorsFile*, std::pair<unsigned, size_t>> FilesByHeader(
    const std::vector<std::shared_ptr<const TreeImage>>& images) {
  std::map<const SafetensorsFile*, std::pair<unsigned, size_t>> out;
  for (unsigned t = 0; t < images.size(); ++t) {
    for (size_t i = 0; i < images[t]->files.size(); ++i) {
      if (images[t]->files[i].safetensors) out[images[t]->files[i].safetensors.get()] = {t, i};
    }
  }
  return out;
}

// What every part reads of a file before streaming (PartFile::seen). A file read whole has its
// digest; the others keep their length prefix and header.
Digest SeenOf(const ImageFile& f) {
  if (f.stream_from) return Sha256Of(*f.content);
  return f.sha256.value_or(Digest{});
}

absl::Status Refuse(const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("cannot merge the audit parts: ", why));
}

// Findings all parts may count together: far more than any tree has groups or blocks, and low
// enough that no sum of them wraps (a part's counts of 2^64 - k would otherwise cancel the k
// findings another part made, docs/audit-parts.md).
constexpr uint64_t kMaxFindings = uint64_t{1} << 62;

// Adds every count of `list` to `*sum`; false once the sum passes kMaxFindings.
bool CountFindings(const quant::FindingList& list, uint64_t* sum) {
  for (const auto& [code, n] : list.by_code()) {
    if (n > kMaxFindings - *sum) return false;
    *sum += n;
  }
  return true;
}

}  // namespace

PartOptions PartOptionsOf(const AuditOptions& o) {
  PartOptions p;
  p.root = o.root;
  p.source = o.source;
  p.policy = o.policy;
  for (const quant::RootMapping& m : o.root_map) {
    p.root_map.push_back(EncodeName(m.declared) + "=" + EncodeName(m.actual));
  }
  p.model_ref = o.refs.model_ref;
  p.source_ref = o.refs.source_ref;
  p.image_digest = o.refs.image_digest;
  p.invoker = o.invoker;
  p.allow_symlinks = o.links.allow_symlinks;
  p.confine = o.links.confine;
  p.allowed = o.links.allowed;
  return p;
}

absl::StatusOr<AuditOptions> AuditOptionsOf(const PartOptions& p) {
  AuditOptions o;
  o.root = p.root;
  o.source = p.source;
  o.policy = p.policy;
  for (const std::string& spec : p.root_map) {
    absl::StatusOr<quant::RootMapping> m = quant::ParseRootMapping(spec);
    if (!m.ok()) return m.status();
    o.root_map.push_back(*m);
  }
  o.refs = {p.model_ref, p.source_ref, p.image_digest};
  o.invoker = p.invoker;
  o.links = {p.allow_symlinks, p.confine, p.allowed};
  return o;
}

PartAssignment AssignParts(const std::vector<std::shared_ptr<const TreeImage>>& images,
                           const WorkPlan& plan, unsigned count) {
  const auto by_header = FilesByHeader(images);
  // Each key's bytes per file (a tensor named by two units of one key counts once).
  std::map<std::string, std::map<std::pair<unsigned, size_t>, uint64_t>> bytes;
  std::map<std::string, std::set<const TensorInfo*>> counted;
  for (const WorkPlan::Keyed& k : plan.keyed()) {
    auto& per_file = bytes[k.key];
    for (const auto& [file, info] : k.work.tensors) {
      auto it = by_header.find(file);
      if (it == by_header.end() || !counted[k.key].insert(info).second) continue;
      per_file[it->second] += info->num_bytes();
    }
  }
  // A key's anchor: the root file holding most of its bytes, else the file that does.
  auto anchor_of = [](const std::map<std::pair<unsigned, size_t>, uint64_t>& per_file) {
    std::optional<std::pair<unsigned, size_t>> best;
    uint64_t most = 0;
    for (unsigned tree : {0u, 1u}) {
      for (const auto& [file, n] : per_file) {
        if (file.first != tree || (best && n <= most)) continue;
        best = file;
        most = n;
      }
      if (best) break;
    }
    return best;
  };
  // Groups: one per root file; a source file joins the root file whose keys need most of it.
  const size_t root_files = images[0]->files.size();
  std::vector<std::vector<size_t>> group_of(images.size());
  group_of[0].resize(root_files);
  for (size_t i = 0; i < root_files; ++i) group_of[0][i] = i;
  std::vector<uint64_t> group_size;
  for (const ImageFile& f : images[0]->files) group_size.push_back(f.size());
  if (images.size() > 1) {
    std::map<size_t, std::map<size_t, uint64_t>> affinity;  // source file -> root file -> bytes
    for (const auto& [key, per_file] : bytes) {
      auto anchor = anchor_of(per_file);
      if (!anchor || anchor->first != 0) continue;
      for (const auto& [file, n] : per_file) {
        if (file.first == 1) affinity[file.second][anchor->second] += n;
      }
    }
    group_of[1].resize(images[1]->files.size());
    for (size_t i = 0; i < images[1]->files.size(); ++i) {
      auto it = affinity.find(i);
      if (it == affinity.end()) {
        group_of[1][i] = group_size.size();
        group_size.push_back(images[1]->files[i].size());
        continue;
      }
      size_t best = it->second.begin()->first;
      for (const auto& [root_file, n] : it->second) {
        if (n > it->second.at(best)) best = root_file;
      }
      group_of[1][i] = best;
      group_size[best] += images[1]->files[i].size();
    }
  }
  const std::vector<unsigned> part_of_group = AssignLargestFirst(group_size, count);
  PartAssignment a;
  a.groups = group_size.size();
  a.file_part.resize(images.size());
  for (unsigned t = 0; t < images.size(); ++t) {
    for (size_t i = 0; i < images[t]->files.size(); ++i) {
      a.file_part[t][images[t]->files[i].name] = part_of_group[group_of[t][i]];
    }
  }
  for (const WorkPlan::Keyed& k : plan.keyed()) {
    auto anchor = anchor_of(bytes[k.key]);
    a.key_part[k.key] = anchor ? part_of_group[group_of[anchor->first][anchor->second]] : 0;
  }
  return a;
}

absl::StatusOr<AuditPart> RunAuditPart(const AuditOptions& options, const PartSpec& spec,
                                       Progress& progress, AuditStats* stats) {
  if (absl::Status s = CheckPartSpec(spec, "--part"); !s.ok()) return s;
  AuditPart part;
  part.spec = spec;
  part.options = PartOptionsOf(options);
  part.started_at = evidence::Rfc3339Now();
  part.environment = evidence::CollectEnvironment();
  auto run = AuditRun::Open(options, progress, /*tensor_digests=*/true);
  if (!run.ok()) return run.status();
  AuditRun& r = **run;
  const Engine& e = r.engine();
  absl::StatusOr<WorkPlan> plan = e.Plan(r.checks());
  if (!plan.ok()) return plan.status();
  const std::vector<std::shared_ptr<const TreeImage>> opened = e.images();
  const PartAssignment assigned = AssignParts(opened, *plan, spec.count);
  if (absl::Status s = CheckPartSpec(spec, "--part", assigned.groups); !s.ok()) return s;
  absl::Status kept = plan->KeepOnly(
      [&](const std::string& key) { return assigned.key_part.at(key) == spec.index; });
  if (!kept.ok()) return kept;
  auto streamed = e.Stream(*std::move(plan), progress, [&](size_t tree, const ImageFile& f) {
    return assigned.file_part[tree].at(f.name) != spec.index;
  });
  if (!streamed.ok()) return streamed.status();
  for (const auto& image : streamed->images) {
    if (absl::Status s = image->CheckUnchanged(); !s.ok()) return s;
  }
  if (stats != nullptr) stats->peak_kept_bytes = streamed->peak_kept_bytes;

  for (unsigned t = 0; t < streamed->images.size(); ++t) {
    const TreeImage& image = *streamed->images[t];
    part.bytes_read += image.bytes_read;
    (t == 0 ? part.root_seen : part.source_seen) = image.RootPath();
    for (size_t i = 0; i < image.files.size(); ++i) {
      const ImageFile& f = image.files[i];
      PartFile pf;
      pf.tree = t;
      pf.name = f.name;
      pf.size = f.size();
      pf.seen = SeenOf(opened[t]->files[i]);
      pf.hashed = assigned.file_part[t].at(f.name) == spec.index;
      if (pf.hashed) {
        pf.sha256 = f.sha256;
        pf.git_blob_id = f.git_blob_id;
        if (f.safetensors != nullptr) {
          const auto& tensors = f.safetensors->tensors();
          for (size_t k = 0; k < tensors.size() && k < f.tensor_digests.size(); ++k) {
            const uint64_t at = f.safetensors->data_start();
            pf.tensors.push_back({tensors[k].name, at + tensors[k].begin, at + tensors[k].end,
                                  f.tensor_digests[k]});
          }
        }
      }
      part.files.push_back(std::move(pf));
    }
  }
  for (const RangeDigest& d : streamed->ranges) {
    part.ranges.push_back({static_cast<unsigned>(d.image), d.file,
                           {d.tensor, d.begin, d.end, d.sha256}});
  }
  bool found = false;
  ScaleWindowCheck& window = r.window();
  for (size_t i = 0; i < window.units(); ++i) {
    if (!window.ran(i)) continue;
    WindowUnitResult u{i, window.unit_name(i), quant::MembersOf(window.outcome(i))};
    for (const auto& m : u.members) found |= m.nan.total() + m.over_span.total() > 0;
    part.window_units.push_back(std::move(u));
  }
  PairCheck& pair = r.pair();
  for (size_t i = 0; i < pair.units(); ++i) {
    if (!pair.ran(i)) continue;
    found |= pair.outcome(i).found.total() > 0;
    part.pair_units.push_back({i, pair.unit_name(i), pair.outcome(i)});
  }
  part.verdict = found ? "fail" : "pass";
  if (stats != nullptr) stats->bytes_read = part.bytes_read;
  part.finished_at = evidence::Rfc3339Now();
  return part;
}

namespace {

// The merge's own view of the files, checked against every part's, completed with the digests
// of the part that hashed each file.
class Merger {
 public:
  Merger(const std::vector<const SignedPart*>& parts, const PartAssignment& assigned)
      : parts_(parts), assigned_(assigned) {}

  absl::StatusOr<std::vector<std::shared_ptr<const TreeImage>>> Files(
      const std::vector<std::shared_ptr<const TreeImage>>& opened) {
    std::vector<std::shared_ptr<TreeImage>> images;
    for (const auto& image : opened) images.push_back(std::make_shared<TreeImage>(*image));
    // Every part lists every file of both trees, in listing order.
    size_t total = 0;
    for (const auto& image : images) total += image->files.size();
    for (const SignedPart* p : parts_) {
      if (p->part.files.size() != total) {
        return Refuse(absl::StrCat(Named(*p), " lists ",
                                   p->part.files.size(), " files; the trees hold ", total));
      }
    }
    size_t at = 0;
    for (unsigned t = 0; t < images.size(); ++t) {
      for (ImageFile& f : images[t]->files) {
        const PartFile* owner = nullptr;
        const SignedPart* owner_part = nullptr;
        for (const SignedPart* p : parts_) {
          const PartFile& pf = p->part.files[at];
          const std::string where = Named(*p);
          if (pf.tree != t || pf.name != f.name || pf.size != f.size()) {
            return Refuse(absl::StrCat(where, " lists ", TreeName(pf.tree), " file ",
                                       pf.name, " (", pf.size, " bytes) where the ",
                                       TreeName(t), " holds ", f.name, " (", f.size(),
                                       " bytes)"));
          }
          if (pf.seen != SeenOf(f)) {
            return Refuse(absl::StrCat(TreeName(t), " file ", f.name, ": ", where,
                                       " read other header bytes than the merge reads now"));
          }
          if (!pf.hashed) continue;
          // Only the part the file belongs to may hash it: so at most one does.
          if (assigned_.file_part[t].at(f.name) != p->part.spec.index) {
            return Refuse(absl::StrCat(TreeName(t), " file ", f.name, " is hashed by ", where,
                                       ", which is not the part it belongs to"));
          }
          owner = &pf;
          owner_part = p;
        }
        if (owner == nullptr || !owner->sha256) {
          return Refuse(absl::StrCat(TreeName(t), " file ", f.name, " is hashed by no part"));
        }
        if (absl::Status s = Complete(*owner, *owner_part, t, &f); !s.ok()) return s;
        ++at;
      }
    }
    std::vector<std::shared_ptr<const TreeImage>> out(images.begin(), images.end());
    return out;
  }

  // Every range a part read from another part's file has the digest the hashing part took.
  absl::Status Ranges() const {
    for (const SignedPart* p : parts_) {
      for (const PartRange& r : p->part.ranges) {
        auto found = hashed_.find({r.tree, r.file, r.tensor.name});
        if (found == hashed_.end()) {
          return Refuse(absl::StrCat(Named(*p), " read tensor '",
                                     r.tensor.name, "' of ", TreeName(r.tree), " file ", r.file,
                                     ", which no part hashed"));
        }
        const auto& [tensor, owner] = found->second;
        if (owner == p || tensor->begin != r.tensor.begin || tensor->end != r.tensor.end ||
            tensor->sha256 != r.tensor.sha256) {
          return Refuse(absl::StrCat(
              TreeName(r.tree), " file ", r.file, ", tensor '", r.tensor.name, "': ", Named(*p),
              " checked bytes [", r.tensor.begin, ", ", r.tensor.end, ") with sha256 ",
              ToHex(r.tensor.sha256), ", but ", Named(*owner), ", which hashed the file, saw [",
              tensor->begin, ", ", tensor->end, ") with sha256 ", ToHex(tensor->sha256)));
        }
      }
    }
    return absl::OkStatus();
  }

  // The SHA-256 the hashing part took of a tensor, by its header.
  std::optional<Digest> TensorDigest(unsigned tree, const std::string& file,
                                     const std::string& tensor) const {
    auto found = hashed_.find({tree, file, tensor});
    if (found == hashed_.end()) return std::nullopt;
    return found->second.first->sha256;
  }

 private:
  // `f` as the owner hashed it: its digests, the stream's part done.
  absl::Status Complete(const PartFile& owner, const SignedPart& part, unsigned tree,
                        ImageFile* f) {
    if (f->stream_from) {
      f->sha256 = owner.sha256;
      if (f->wants_git_blob_id) f->git_blob_id = owner.git_blob_id;
      f->stream_from.reset();
    } else if (owner.sha256 != f->sha256 ||
               (f->wants_git_blob_id && owner.git_blob_id != f->git_blob_id)) {
      // Read whole by the merge too: the record's digests are the merge's own.
      return Refuse(absl::StrCat(TreeName(tree), " file ", f->name, ": ", part.label,
                                 " lists other digests than the merge reads now"));
    }
    if (f->safetensors != nullptr) {
      const auto& tensors = f->safetensors->tensors();
      const uint64_t at = f->safetensors->data_start();
      bool same = owner.tensors.size() == tensors.size();
      for (size_t k = 0; same && k < tensors.size(); ++k) {
        same = owner.tensors[k].name == tensors[k].name &&
               owner.tensors[k].begin == at + tensors[k].begin &&
               owner.tensors[k].end == at + tensors[k].end;
      }
      if (!same) {
        return Refuse(absl::StrCat(TreeName(tree), " file ", f->name, ": ", part.label,
                                   " lists other tensors than its header holds"));
      }
      // Tensor digests stay out of the record, as on one machine (the engine's default).
      f->tensor_digests.clear();
      for (const PartTensor& t : owner.tensors) hashed_[{tree, f->name, t.name}] = {&t, &part};
    }
    return absl::OkStatus();
  }

  const std::vector<const SignedPart*>& parts_;
  const PartAssignment& assigned_;
  std::map<std::tuple<unsigned, std::string, std::string>,
           std::pair<const PartTensor*, const SignedPart*>>
      hashed_;
};

// Each unit's outcome, from the one part that ran it. `Unit` is WindowUnitResult or
// PairUnitResult; `skip(i)` for units no part runs.
template <typename Unit, typename UnitCheck, typename Units, typename Set, typename Skip>
absl::Status Outcomes(const char* check_name, const std::vector<const SignedPart*>& parts,
                      UnitCheck& check, Units units_of, Set set, Skip skip) {
  std::vector<const SignedPart*> ran_by(check.units(), nullptr);
  for (const SignedPart* p : parts) {
    for (const Unit& u : units_of(p->part)) {
      if (u.unit >= check.units() || u.name != check.unit_name(u.unit) || skip(u.unit)) {
        return Refuse(absl::StrCat(Named(*p), " ran ", check_name,
                                   " unit ", u.unit, " '", EncodeName(u.name),
                                   "', which the audit does not plan"));
      }
      if (ran_by[u.unit] != nullptr) {
        return Refuse(absl::StrCat(check_name, " unit '", EncodeName(u.name), "' is in ",
                                   ran_by[u.unit]->label, " and ", p->label));
      }
      ran_by[u.unit] = p;
      set(u);
    }
  }
  for (size_t i = 0; i < check.units(); ++i) {
    if (ran_by[i] == nullptr && !skip(i)) {
      return Refuse(absl::StrCat(check_name, " unit '", EncodeName(check.unit_name(i)),
                                 "' is in no part"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<evidence::EvidenceRecord> MergeAuditParts(const std::vector<SignedPart>& given,
                                                         Progress& progress,
                                                         const MergeOptions& merge) {
  if (given.empty()) return Refuse("no parts given");
  const AuditPart& first = given.front().part;
  const unsigned count = first.spec.count;
  // By index; a slot only for a part given (a part's count is the node's word, up to 2^32).
  std::map<unsigned, const SignedPart*> by_index;
  for (const SignedPart& p : given) {
    const std::string where = Named(p);
    if (p.part.spec.count != count || p.part.spec.index >= count) {
      return Refuse(absl::StrCat(where, " does not belong with ", Named(given.front())));
    }
    if (!(p.part.options == first.options)) {
      return Refuse(absl::StrCat(where, " was run with other options than ",
                                 given.front().label));
    }
    if (p.part.environment.tool_version != first.environment.tool_version ||
        p.part.environment.git_commit != first.environment.git_commit) {
      return Refuse(absl::StrCat(where, " was run by ckpt-audit ",
                                 p.part.environment.tool_version, " (",
                                 p.part.environment.git_commit, "), ", given.front().label,
                                 " by ", first.environment.tool_version, " (",
                                 first.environment.git_commit, ")"));
    }
    const SignedPart*& slot = by_index[p.part.spec.index];
    if (slot != nullptr) {
      return Refuse(absl::StrCat("part ", p.part.spec.index, "/", count, " is given twice (",
                                 slot->label, " and ", p.label, ")"));
    }
    slot = &p;
  }
  // Indices are below count and distinct, so all are given when there are count of them.
  for (unsigned i = 0; by_index.size() < count; ++i) {
    if (!by_index.contains(i)) return Refuse(absl::StrCat("part ", i, "/", count, " is missing"));
  }
  std::vector<const SignedPart*> parts;
  for (const auto& [index, p] : by_index) parts.push_back(p);

  auto options = AuditOptionsOf(first.options);
  if (!options.ok()) return options.status();
  options->threads = merge.threads;
  options->memory_window = merge.memory_window;
  if (merge.root_dir != nullptr) options->root_dir = merge.root_dir;
  if (merge.source_dir != nullptr) options->source_dir = merge.source_dir;
  auto run = AuditRun::Open(*options, progress);
  if (!run.ok()) return run.status();
  AuditRun& r = **run;
  absl::StatusOr<WorkPlan> plan = r.engine().Plan(r.checks());
  if (!plan.ok()) return plan.status();
  const std::vector<std::shared_ptr<const TreeImage>> opened = r.engine().images();
  // Each part read the trees the merge opened, by their real paths: a root swapped for a link
  // to another tree while the parts ran, or a node that mounts another tree at the path, would
  // otherwise merge into a record of the tree the merge opened.
  for (const SignedPart* p : parts) {
    for (unsigned t = 0; t < opened.size(); ++t) {
      const std::string& seen = t == 0 ? p->part.root_seen : p->part.source_seen;
      if (seen != opened[t]->root) {
        return Refuse(absl::StrCat(Named(*p), " read the ", t == 0 ? "root" : "source", " at ",
                                   EncodeName(seen), ", the merge opened ",
                                   EncodeName(opened[t]->root), ": not the tree the audit was "
                                   "started on"));
      }
    }
  }
  const PartAssignment assigned = AssignParts(opened, *plan, count);
  Merger merger(parts, assigned);
  auto images = merger.Files(opened);
  if (!images.ok()) return images.status();
  if (absl::Status s = merger.Ranges(); !s.ok()) return s;

  uint64_t findings = 0;
  for (const SignedPart* p : parts) {
    bool fits = true;
    for (const WindowUnitResult& u : p->part.window_units) {
      for (const quant::ScaleWindowMemberResult& m : u.members) {
        fits = fits && CountFindings(m.nan, &findings) && CountFindings(m.over_span, &findings);
      }
    }
    for (const PairUnitResult& u : p->part.pair_units) {
      fits = fits && CountFindings(u.outcome.found, &findings);
    }
    if (!fits) {
      return Refuse(absl::StrCat("the parts up to ", Named(*p), " count more findings than ",
                                 kMaxFindings));
    }
  }
  ScaleWindowCheck& window = r.window();
  absl::Status s = Outcomes<WindowUnitResult>(
      "scale_window", parts, window,
      [](const AuditPart& p) -> const auto& { return p.window_units; },
      [&](const WindowUnitResult& u) { window.SetOutcome(u.unit, quant::PartialOf(u.members)); },
      [](size_t) { return false; });
  if (!s.ok()) return s;
  PairCheck& pair = r.pair();
  s = Outcomes<PairUnitResult>(
      "pair_verify", parts, pair, [](const AuditPart& p) -> const auto& { return p.pair_units; },
      [&](const PairUnitResult& u) { pair.SetOutcome(u.unit, u.outcome); },
      [&](size_t i) { return pair.hashed_tensor(i) != nullptr; });
  if (!s.ok()) return s;
  // The units compared by digest: the digests the parts that hashed their files took.
  const Checkpoints trees = r.engine().checkpoints();
  for (size_t i = 0; i < pair.units(); ++i) {
    const std::string* name = pair.hashed_tensor(i);
    if (name == nullptr) continue;
    std::optional<Digest> digests[2];
    for (unsigned t : {0u, 1u}) {
      const Checkpoint& ckpt = t == 0 ? *trees.root : *trees.source;
      const SafetensorsFile* file = ckpt.Find(*name)->file;
      for (const ImageFile& f : (*images)[t]->files) {
        if (f.safetensors.get() == file) digests[t] = merger.TensorDigest(t, f.name, *name);
      }
    }
    if (!digests[0] || !digests[1]) {
      return Refuse(absl::StrCat("tensor '", EncodeName(*name), "' was hashed by no part"));
    }
    pair.SetDigests(i, *digests[1], *digests[0]);
  }

  uint64_t bytes_read = 0;
  for (const SignedPart* p : parts) bytes_read += p->part.bytes_read;
  auto rec = std::move(r).Record(*images, bytes_read);
  if (!rec.ok()) return rec.status();
  for (const SignedPart* p : parts) {
    rec->started_at = std::min(rec->started_at, p->part.started_at);
    rec->parts.push_back({p->signer, p->part.environment.host, ToHex(p->digest)});
  }
  return rec;
}

}  // namespace ckpt::audit
