#include "services/cli/cli_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/io/tree_stream.h"
#include "core/parallel.h"
#include "core/text/name_encoding.h"
#include "services/cli/commands.h"

namespace ckpt::cli {

int ReportError(const absl::Status& status) {
  std::fprintf(stderr, "ckpt-audit: %s: %s\n",
               absl::StatusCodeToString(status.code()).c_str(),
               EncodeName(std::string(status.message())).c_str());
  return kExitError;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.2f %s", v, kUnits[u]);
}

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  const auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(text), "' is not a size (", why,
                     "): give bytes or a binary size such as 256M, 1.5G or 2GiB"));
  };
  size_t i = 0;
  uint64_t whole = 0;
  while (i < text.size() && absl::ascii_isdigit(text[i])) {
    const uint64_t digit = text[i++] - '0';
    if (whole > (UINT64_MAX - digit) / 10) return bad("too large");
    whole = whole * 10 + digit;
  }
  if (i == 0) return bad("no digits");
  // The fraction as digits over a power of ten (at most 9 digits: exact in 64 bits).
  uint64_t frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t start = i;
    while (i < text.size() && absl::ascii_isdigit(text[i])) {
      if (i - start == 9) return bad("too many decimals");
      frac = frac * 10 + (text[i++] - '0');
      frac_scale *= 10;
    }
    if (i == start) return bad("no digits after the point");
  }
  const std::string unit = absl::AsciiStrToLower(std::string(text.substr(i)));
  int shift = 0;
  if (!unit.empty()) {
    static constexpr std::string_view kPrefixes = "kmgt";
    const size_t p = kPrefixes.find(unit[0]);
    if (p == std::string_view::npos || !(unit.size() == 1 || unit.substr(1) == "ib")) {
      return bad("unknown unit");
    }
    shift = 10 * static_cast<int>(p + 1);
  }
  if (whole > (UINT64_MAX >> shift)) return bad("too large");
  const uint64_t bytes = whole << shift;
  // frac / frac_scale of 2^shift, which must be a whole number of bytes.
  const unsigned __int128 part = (static_cast<unsigned __int128>(frac) << shift);
  if (part % frac_scale != 0) return bad("not a whole number of bytes");
  const uint64_t extra = static_cast<uint64_t>(part / frac_scale);
  if (bytes > UINT64_MAX - extra) return bad("too large");
  return bytes + extra;
}

void AddPkcs11Flags(CLI::App* cmd, evidence::KeySource* source) {
  cmd->add_option("--pkcs11-module", source->pkcs11_module,
                  "PKCS#11 module (.so) holding a --key given as a pkcs11: URI");
  cmd->add_option("--pin-file", source->pin_file,
                  "file holding the token's user PIN (mode 0600); for a pkcs11: key");
  cmd->add_option("--pin-env", source->pin_env,
                  "environment variable holding the token's user PIN; for a pkcs11: key");
}

void AddMemoryWindowFlag(CLI::App* cmd, uint64_t* window) {
  cmd->add_option_function<std::string>(
      "--memory-window",
      [window](const std::string& text) {
        absl::StatusOr<uint64_t> v = ParseByteSize(text);
        if (v.ok() && *v < kMinReadChunk) {
          v = absl::InvalidArgumentError(absl::StrCat(
              text, " is below one read chunk (", HumanBytes(kMinReadChunk), ")"));
        }
        if (!v.ok()) {
          throw CLI::ValidationError("--memory-window",
                                     absl::StrCat("INVALID_ARGUMENT: ", v.status().message()));
        }
        *window = *v;
      },
      absl::StrCat("checkpoint (and source) bytes kept in memory at most: bytes or 256M, 1.5G, "
                   "2GiB (default ", HumanBytes(kDefaultMemoryWindow), ")"));
}

TerminalProgress::TerminalProgress() : tty_(::isatty(STDERR_FILENO) == 1) {}

void TerminalProgress::Begin(std::string_view phase, uint64_t total_units) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = std::string(phase);
  total_ = total_units;
  done_ = 0;
  last_decile_ = -1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

void TerminalProgress::Advance(uint64_t units) {
  uint64_t done = done_.fetch_add(units) + units;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) Draw(done, false);
}

void TerminalProgress::End() {
  std::lock_guard<std::mutex> lock(mu_);
  Draw(done_.load(), true);
}

void TerminalProgress::Draw(uint64_t done, bool final_line) {
  auto now = std::chrono::steady_clock::now();
  double frac = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / total_);
  double secs = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (!final_line && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%-12s [%s%s] %5.1f%% %6.1fs", phase_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 frac * 100, secs);
    if (final_line) std::fputc('\n', stderr);
    return;
  }
  // Plain lines for logs: a new decile at most every 2 s, and always the final line.
  int decile = static_cast<int>(frac * 10);
  if (!final_line &&
      (decile == last_decile_ || now - last_draw_ < std::chrono::seconds(2))) {
    return;
  }
  last_decile_ = decile;
  last_draw_ = now;
  std::fprintf(stderr, "%s: %d%% (%.1fs)\n", phase_.c_str(), decile * 10, secs);
}

void AddThreadsOption(CLI::App* cmd, unsigned* threads) {
  cmd->add_option("--threads", *threads,
                  absl::StrCat("worker threads (0: all cores; at most ", kMaxThreads, ")"))
      ->check(CLI::Range(0u, kMaxThreads));
}

void AddLinkFlags(CLI::App* cmd, LinkOptions* links) {
  cmd->add_flag("--allow-symlinks", links->allow_symlinks,
                "follow symbolic links whose targets stay under the root or a --confine "
                "directory (hub cache snapshots are followed by their own rules)");
  cmd->add_option("--confine", links->confine,
                  "with --allow-symlinks: a directory links may also lead into (repeatable)");
}

namespace {

std::string HubCacheDir() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return v;  // its older name
  if (std::string v = env("HF_HOME"); !v.empty()) return v + "/hub";
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty()) return v + "/huggingface/hub";
  const std::string home = env("HOME");
  return home.empty() ? "" : home + "/.cache/huggingface/hub";  // "": no cache to look in
}

}  // namespace

CLI::Option* AcceptHubRepoIds(CLI::Option* option) {
  option->description(absl::StrCat(option->get_description(),
                                   "; or a Hugging Face repo id, ORG/NAME[@REVISION]"));
  return option->transform(CLI::Validator(
      [](std::string& value) -> std::string {
        struct stat st;
        if (::lstat(value.c_str(), &st) == 0 || errno != ENOENT) return "";  // a path
        std::optional<HubRepoRef> ref = ParseHubRepoRef(value);
        if (!ref) return "";  // the command says the path does not exist
        const std::string cache = HubCacheDir();
        if (cache.empty()) {
          return absl::StrCat(value, ": not a path here, and no Hugging Face cache to look in "
                              "(set HF_HUB_CACHE, HF_HOME or HOME)");
        }
        absl::StatusOr<HubSnapshotPath> found = FindHubSnapshot(cache, *ref);
        if (!found.ok()) return std::string(found.status().message());
        // Said, since a path typed wrong may name a cached repo.
        std::fprintf(stderr, "ckpt-audit: %s@%s is the hub cache's snapshot %s\n",
                     ref->repo_id.c_str(), ref->revision.c_str(), EncodeName(found->path).c_str());
        value = found->path;
        return "";
      },
      "", "hub-repo-id"));
}

absl::StatusOr<PartSpec> ParsePartSpec(const std::string& text) {
  PartSpec spec;
  const size_t slash = text.find('/');
  // Digits only: a sign or a space is refused, and so is a number past 2^32 - 1.
  auto digits = [](absl::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
  };
  if (slash == std::string::npos || !digits(text.substr(0, slash)) ||
      !digits(text.substr(slash + 1)) || !absl::SimpleAtoi(text.substr(0, slash), &spec.index) ||
      !absl::SimpleAtoi(text.substr(slash + 1), &spec.count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--part '", text, "': expected I/N with 0 <= I < N <= ", kMaxParts));
  }
  if (absl::Status s = CheckPartSpec(spec, "--part"); !s.ok()) return s;
  return spec;
}

}  // namespace ckpt::cli
