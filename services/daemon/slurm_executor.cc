#include "services/daemon/slurm_executor.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/audit/part_file.h"
#include "core/audit/parts.h"
#include "core/checkpoint.h"
#include "core/io/small_file.h"
#include "services/daemon/command.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kMaxPartFileBytes = size_t{1} << 30;  // as `audit --merge` reads them
constexpr char kCompleted[] = "COMPLETED";

// Slurm's job states after which a task does not run again (the others: pending, running,
// completing, suspended, requeued...).
bool Ended(const std::string& state) {
  static const char* const kEnded[] = {"COMPLETED", "FAILED",  "TIMEOUT",     "CANCELLED",
                                       "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
                                       "DEADLINE",  "REVOKED", "SPECIAL_EXIT"};
  return std::find(std::begin(kEnded), std::end(kEnded), state) != std::end(kEnded);
}

// A word for a POSIX shell: single-quoted, each ' as '\''.
std::string ShellWord(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// What a command printed, for an error message: one line of printable text, at most 300 bytes.
std::string Printable(absl::string_view text) {
  std::string out;
  for (char c : absl::StripAsciiWhitespace(text)) {
    if (out.size() >= 300) return out + "...";
    const bool printable = std::isprint(static_cast<unsigned char>(c)) != 0;
    out += (c == '\n' || c == '\t') ? ' ' : (printable ? c : '?');
  }
  return out;
}

bool ControllerDown(const CommandResult& r) {
  return absl::StrContains(r.err, "Unable to contact slurm controller") ||
         absl::StrContains(r.err, "Socket timed out") ||
         absl::StrContains(r.err, "Connection refused") ||
         absl::StrContains(r.err, "Zero Bytes were transmitted");
}

// Task ids of "3", "1-2", "0-7%2", "1,3-4" (below 2^20, far above any part count).
std::vector<unsigned> TaskIds(absl::string_view text) {
  std::vector<unsigned> ids;
  text = text.substr(0, text.find('%'));
  for (absl::string_view range : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> ends = absl::StrSplit(range, '-');
    unsigned lo = 0, hi = 0;
    if (ends.empty() || ends.size() > 2 || !absl::SimpleAtoi(ends[0], &lo) ||
        !absl::SimpleAtoi(ends.back(), &hi) || hi < lo || hi >= 1u << 20) {
      continue;
    }
    for (unsigned i = lo; i <= hi; ++i) ids.push_back(i);
  }
  return ids;
}

uint64_t TreeBytes(const std::string& root) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (it->is_regular_file(e) && !it->is_symlink(e)) total += it->file_size(e);
  }
  return total;
}

}  // namespace

// One job's array: its task states as slurmctld (or accounting) reports them.
class SlurmExecutor::Array {
 public:
  struct Task {
    std::string state = "PENDING";
    std::string exit_code;
  };
  Array(const SlurmOptions& options, std::string id, std::string dir, unsigned parts)
      : options_(options), id_(std::move(id)), dir_(std::move(dir)), tasks_(parts) {}

  // Updates the tasks' states: OK, UNAVAILABLE (slurmctld did not answer) or another error.
  absl::Status Refresh() {
    auto r = RunCommand({"scontrol", "show", "job", "-o", id_}, options_.command_timeout);
    if (!r.ok()) return absl::UnavailableError(std::string(r.status().message()));
    if (r->exit_code == 0) {
      bool mine = false;
      for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
        // The first of each key: ours come before the free-text ones (Command=, WorkDir=).
        std::map<std::string, std::string> fields;
        for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
          std::pair<std::string, std::string> kv = absl::StrSplit(word, absl::MaxSplits('=', 1));
          fields.insert(std::move(kv));
        }
        if (fields["ArrayJobId"] != id_) continue;
        for (unsigned i : TaskIds(fields["ArrayTaskId"])) {
          if (i >= tasks_.size()) continue;
          tasks_[i] = {fields["JobState"], fields["ExitCode"]};
          mine = true;
        }
      }
      // A job id that is no array of this many tasks (an id changed in the database) is
      // followed no further than one slurmctld forgot.
      if (mine) return absl::OkStatus();
      return FromAccounting(absl::StrCat("no task of array job ", id_, " in its answer"));
    }
    if (ControllerDown(*r)) {
      return absl::UnavailableError(absl::StrCat("slurmctld: ", Printable(r->err)));
    }
    // Gone from slurmctld's memory (MinJobAge): accounting, where it is on, still knows.
    return FromAccounting(Printable(r->err));
  }

  const std::vector<Task>& tasks() const { return tasks_; }

  // "0 RUNNING, 1 PENDING, 2 COMPLETED".
  std::string Summary() const {
    std::vector<std::string> words;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      words.push_back(absl::StrCat(i, " ", tasks_[i].state));
    }
    return absl::StrJoin(words, ", ");
  }

  // scancel, then up to 30 s until no task is pending or running any more.
  absl::Status Cancel() {
    auto r = RunCommand({"scancel", id_}, options_.command_timeout);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0) {
      return absl::UnavailableError(absl::StrCat("scancel ", id_, ": ", Printable(r->err)));
    }
    for (int i = 0; i < 60; ++i) {
      if (Refresh().ok() && std::all_of(tasks_.begin(), tasks_.end(),
                                        [](const Task& t) { return Ended(t.state); })) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status FromAccounting(const std::string& scontrol_said) {
    auto r = RunCommand({"sacct", "-n", "-P", "-X", "-j", id_, "-o", "JobID,State,ExitCode"},
                        options_.command_timeout);
    bool known = false;
    if (r.ok() && r->exit_code == 0) {
      for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
        std::vector<std::string> f = absl::StrSplit(line, '|');
        if (f.size() != 3 || !absl::StartsWith(f[0], id_ + "_")) continue;
        for (unsigned i : TaskIds(absl::string_view(f[0]).substr(id_.size() + 1))) {
          if (i >= tasks_.size()) continue;
          // "CANCELLED by 0": the state is the first word.
          tasks_[i] = {f[1].substr(0, f[1].find(' ')), f[2]};
          known = true;
        }
      }
    }
    if (known) return absl::OkStatus();
    // Without accounting, a finished array is forgotten: its part files say which parts ended
    // well (a part writes its file last, renamed into place), the merge checks them all.
    std::vector<std::string> missing;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      struct stat st;
      if (::stat(absl::StrCat(dir_, "/part-", i, ".json").c_str(), &st) == 0) {
        tasks_[i] = {kCompleted, ""};
      } else {
        missing.push_back(absl::StrCat(i));
      }
    }
    if (missing.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "Slurm array job ", id_, " is unknown to slurmctld (", scontrol_said,
        ") and to accounting, and parts ", absl::StrJoin(missing, ", "), " left no part file"));
  }

  const SlurmOptions& options_;
  const std::string id_, dir_;
  std::vector<Task> tasks_;
};

absl::StatusOr<std::unique_ptr<SlurmExecutor>> SlurmExecutor::Create(SlurmOptions options) {
  if (options.parts_dir.empty() || options.node_key.empty() || options.part_trust.empty()) {
    return absl::InvalidArgumentError(
        "--executor slurm needs --slurm-parts-dir, --slurm-node-key and --part-trust");
  }
  if (options.max_parts == 0 || options.bytes_per_part == 0) {
    return absl::InvalidArgumentError("--slurm-max-parts and --slurm-part-bytes must be > 0");
  }
  auto dir = RealPath(options.parts_dir);
  if (!dir.ok()) return dir.status();
  options.parts_dir = *dir;
  auto trust = evidence::TrustStore::Load(options.part_trust);
  if (!trust.ok()) return trust.status();
  return std::unique_ptr<SlurmExecutor>(new SlurmExecutor(std::move(options), *std::move(trust)));
}

absl::StatusOr<unsigned> SlurmExecutor::PartsFor(unsigned requested, const std::string& root,
                                                 const std::string& source) const {
  if (requested > options_.max_parts) {
    return absl::InvalidArgumentError(absl::StrCat("parts: ", requested, " is more than the ",
                                                   options_.max_parts, " this daemon allows"));
  }
  if (requested != 0) return requested;
  const uint64_t bytes = TreeBytes(root) + (source.empty() ? 0 : TreeBytes(source));
  const uint64_t parts = (bytes + options_.bytes_per_part - 1) / options_.bytes_per_part;
  return static_cast<unsigned>(std::clamp<uint64_t>(parts, 1, options_.max_parts));
}

absl::StatusOr<evidence::EvidenceRecord> SlurmExecutor::Run(const JobSpec& spec,
                                                            const audit::AuditOptions& options,
                                                            JobRun& run) const {
  const unsigned n = spec.parts;
  if (n == 0 || n > options_.max_parts) {
    return absl::InvalidArgumentError(absl::StrCat("parts: ", n, " is not 1 to ",
                                                   options_.max_parts));
  }
  const std::string dir = absl::StrCat(options_.parts_dir, "/", run.id());
  const std::string name = absl::StrCat("ckpt-auditd-", run.id());
  std::string array_id = spec.executor_job;
  if (array_id.empty()) {
    // An array of this job that a stopped daemon submitted but did not get to store.
    auto found = RunCommand({"squeue", "-h", "-n", name, "-o", "%F"}, options_.command_timeout);
    if (found.ok() && found->exit_code == 0) {
      std::vector<std::string> ids = absl::StrSplit(found->out, '\n', absl::SkipWhitespace());
      if (!ids.empty()) array_id = std::string(absl::StripAsciiWhitespace(ids[0]));
    }
  }
  if (array_id.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // what an earlier attempt left
    if (!std::filesystem::create_directories(dir, ec) && ec) {
      return absl::FailedPreconditionError(absl::StrCat(dir, ": ", ec.message()));
    }
    std::string cmd = absl::StrCat(ShellWord(options_.audit_binary), " audit ",
                                   ShellWord(options.root));
    if (!options.source.empty()) absl::StrAppend(&cmd, " --source ", ShellWord(options.source));
    absl::StrAppend(&cmd, " --policy ", ShellWord(options.policy));
    for (const quant::RootMapping& m : options.root_map) {
      absl::StrAppend(&cmd, " --map-root ", ShellWord(absl::StrCat(m.declared, "=", m.actual)));
    }
    if (!options.invoker.empty()) absl::StrAppend(&cmd, " --invoker ", ShellWord(options.invoker));
    for (const std::string& a : options.links.allowed) {
      absl::StrAppend(&cmd, " --links-allowed ", ShellWord(a));
    }
    absl::StrAppend(&cmd, " --threads \"${SLURM_CPUS_PER_TASK:-0}\" --part \"$SLURM_ARRAY_TASK_ID/",
                    n, "\" --part-key ", ShellWord(options_.node_key), " --out ",
                    ShellWord(dir + "/part-"), "\"$SLURM_ARRAY_TASK_ID\".json");
    const std::string script = absl::StrCat(
        "#!/bin/sh\n# ckpt-auditd job ", run.id(), ": one of ", n,
        " parts, written by the daemon (docs/daemon.md \"Slurm executor\")\nexec ", cmd, "\n");
    {
      std::ofstream out(dir + "/parts.sh", std::ios::binary | std::ios::trunc);
      out << script;
      if (!out.flush()) {
        return absl::FailedPreconditionError(absl::StrCat(dir, "/parts.sh: cannot write"));
      }
    }
    std::vector<std::string> argv = {"sbatch", "--parsable", absl::StrCat("--array=0-", n - 1),
                                     "--job-name=" + name, "--chdir=" + dir,
                                     "--output=" + dir + "/part-%a.out"};
    argv.insert(argv.end(), options_.sbatch_args.begin(), options_.sbatch_args.end());
    argv.push_back(dir + "/parts.sh");
    auto r = RunCommand(argv, options_.command_timeout);
    if (!r.ok()) return absl::UnavailableError(r.status().message());
    if (r->exit_code != 0) {
      const std::string said = Printable(r->err);
      return ControllerDown(*r)
                 ? absl::UnavailableError(absl::StrCat("sbatch: slurmctld: ", said))
                 : absl::FailedPreconditionError(absl::StrCat("sbatch refused the parts: ", said));
    }
    array_id = std::string(absl::StripAsciiWhitespace(r->out));
    array_id = array_id.substr(0, array_id.find(';'));  // "ID;CLUSTER"
  }
  if (array_id.empty() || !std::all_of(array_id.begin(), array_id.end(), ::isdigit)) {
    return absl::InternalError(absl::StrCat("not a Slurm job id: '", Printable(array_id), "'"));
  }
  if (array_id != spec.executor_job) {
    if (auto s = run.SetExecutorJob(array_id); !s.ok()) return s;
  }
  run.Note("slurm", 0, n, absl::StrCat("Slurm array job ", array_id, ": ", n, " parts in ", dir));

  Array array(options_, array_id, dir, n);
  std::string shown;
  absl::Time answered = absl::Now();
  for (;;) {
    if (run.Cancelled()) {
      if (!run.CancelledByCaller()) {
        return absl::CancelledError(absl::StrCat(
            "the daemon stops; Slurm array job ", array_id, " keeps running and is followed "
            "again when it starts"));
      }
      absl::Status cancelled = array.Cancel();
      return absl::CancelledError(absl::StrCat(
          "job cancelled; Slurm array job ", array_id,
          cancelled.ok() ? " scancelled" : absl::StrCat(" not scancelled: ", cancelled.message()),
          "; nothing was signed"));
    }
    absl::Status refreshed = array.Refresh();
    if (absl::IsUnavailable(refreshed)) {
      if (absl::Now() - answered > options_.unreachable_grace) {
        return absl::UnavailableError(absl::StrCat(
            "Slurm array job ", array_id, ": no answer from slurmctld for ",
            absl::FormatDuration(options_.unreachable_grace), " (", refreshed.message(),
            "); the parts may still run"));
      }
    } else if (!refreshed.ok()) {
      return refreshed;
    } else {
      answered = absl::Now();
      const std::string summary = array.Summary();
      size_t completed = 0;
      for (const auto& t : array.tasks()) completed += t.state == kCompleted;
      if (summary != shown) {
        run.Note("parts", completed, n, absl::StrCat("Slurm array job ", array_id, ": ", summary));
        shown = summary;
      }
      for (size_t i = 0; i < n; ++i) {
        const Array::Task& t = array.tasks()[i];
        if (!Ended(t.state) || t.state == kCompleted) continue;
        array.Cancel().IgnoreError();  // the other parts are of no use now
        std::string said;
        if (auto out = io::ReadSmallFile(absl::StrCat(dir, "/part-", i, ".out"),
                                         io::SmallFileRules{.max_bytes = 1 << 20});
            out.ok()) {
          absl::string_view text = absl::StripTrailingAsciiWhitespace(*out);
          said = Printable(text.substr(text.rfind('\n') == absl::string_view::npos
                                           ? 0 : text.rfind('\n') + 1));
        }
        return absl::AbortedError(absl::StrCat(
            "part ", i, " of ", n, " (Slurm job ", array_id, "_", i, ") ended ", t.state,
            t.exit_code.empty() ? "" : absl::StrCat(" (exit code ", t.exit_code, ")"),
            said.empty() ? "" : absl::StrCat(": ", said), "; nothing was signed"));
      }
      if (completed == n) break;
    }
    for (absl::Time until = absl::Now() + options_.poll;
         absl::Now() < until && !run.Cancelled();) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // Every part completed: open each under the node keys, check it ran this job's audit, merge.
  const audit::PartOptions expected = audit::PartOptionsOf(options);
  std::vector<audit::SignedPart> parts;
  for (unsigned i = 0; i < n; ++i) {
    const std::string path = absl::StrCat(dir, "/part-", i, ".json");
    auto text = io::ReadSmallFile(path, io::SmallFileRules{.what = "part file",
                                                           .max_bytes = kMaxPartFileBytes});
    if (!text.ok()) return text.status();
    auto part = audit::OpenAuditPart(*text, trust_, path);
    if (!part.ok()) return part.status();
    if (!(part->part.options == expected)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": the part ran another audit than job ", run.id(), " asked for (root '",
          part->part.options.root, "', source '", part->part.options.source, "', policy '",
          part->part.options.policy, "'); nothing was signed"));
    }
    parts.push_back(*std::move(part));
  }
  // The merge reads through the directories the job checked, and every part must have read
  // the trees at their real paths (docs/audit-parts.md, "What a part trusts").
  return audit::MergeAuditParts(
      parts, run, {options.threads, options.memory_window, options.root_dir, options.source_dir});
}

}  // namespace ckpt::daemon
