#include "core/oci/credentials.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/evidence/base64.h"
#include "core/io/small_file.h"
#include "core/text/json_parse.h"

extern char** environ;

namespace ckpt::oci {
namespace {

constexpr size_t kMaxHelperAnswer = 64u << 10;
// What Docker's helpers print (and exit non-zero with) when they hold nothing for a registry.
constexpr char kHelperHasNone[] = "credentials not found in native keychain";
constexpr char kIdentityTokenUser[] = "<token>";

// The registry host[:port] of a config key ("https://host:port/v1/" or "host").
std::string HostOf(absl::string_view key) {
  absl::ConsumePrefix(&key, "https://") || absl::ConsumePrefix(&key, "http://");
  return absl::AsciiStrToLower(key.substr(0, key.find('/')));
}

bool SafeHelperName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// Both ends of a socket pair (a socket, not a pipe, so that writing to a helper that exited
// early is an error and never SIGPIPE), closed on destruction.
struct Channel {
  int fd[2] = {-1, -1};
  bool Open() { return ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd) == 0; }
  void Close(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
  ~Channel() {
    Close(0);
    Close(1);
  }
};

// A spawned helper, killed and reaped unless it was reaped already.
struct Child {
  pid_t pid = -1;
  int status = 0;
  bool reaped = false;
  // Waits for it to exit until `deadline`; false when it had not.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    while (!reaped) {
      pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid || (r < 0 && errno != EINTR)) {
        reaped = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  ~Child() {
    if (pid <= 0 || reaped) return;
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
};

// `PROGRAM get` with `registry` on its standard input: what it printed, or NOT_FOUND when it
// holds nothing for the registry. `what` names it in messages.
absl::StatusOr<std::string> RunHelper(const std::string& program, const std::string& registry,
                                      const std::string& what, long timeout_ms) {
  Channel in, out;
  if (!in.Open() || !out.Open()) {
    return absl::InternalError(absl::StrCat(what, ": socketpair: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in.fd[1], 0);
  posix_spawn_file_actions_adddup2(&actions, out.fd[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::string get = "get";
  char* argv[] = {const_cast<char*>(program.c_str()), get.data(), nullptr};
  Child child;
  const int rc = ::posix_spawnp(&child.pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    child.pid = -1;
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot be run: ", rc == ENOENT ? "it is not on PATH" : std::strerror(rc)));
  }
  in.Close(1);
  out.Close(1);
  // A helper that exits without reading its input is judged by its exit status below.
  (void)::send(in.fd[0], registry.data(), registry.size(), MSG_NOSIGNAL);
  in.Close(0);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string late = absl::StrCat(what, ": no answer within ", timeout_ms, " ms; killed");
  std::string answer;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError(late);
    pollfd p{out.fd[0], POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return absl::DeadlineExceededError(late);
    ssize_t n = ::read(out.fd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (answer.size() + static_cast<size_t>(n) > kMaxHelperAnswer) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": printed more than ", kMaxHelperAnswer, " bytes; killed"));
    }
    answer.append(buf, static_cast<size_t>(n));
  }
  if (!child.WaitUntil(deadline)) return absl::DeadlineExceededError(late);
  if (!WIFEXITED(child.status) || WEXITSTATUS(child.status) != 0) {
    if (absl::StripAsciiWhitespace(answer) == kHelperHasNone) {
      return absl::NotFoundError(absl::StrCat(what, ": ", kHelperHasNone));
    }
    // What it printed is not quoted: a failing helper may print a secret.
    return absl::UnauthenticatedError(absl::StrCat(
        what, ": failed (",
        WIFEXITED(child.status) ? absl::StrCat("exit status ", WEXITSTATUS(child.status))
                                : absl::StrCat("signal ", WTERMSIG(child.status)),
        ")"));
  }
  return answer;
}

// The helper's answer as credentials.
absl::StatusOr<RegistryCredentials> FromHelper(const std::string& name,
                                               const std::string& registry,
                                               const std::string& from, long timeout_ms) {
  const std::string program = absl::StrCat("docker-credential-", name);
  const std::string what =
      absl::StrCat("credential helper ", program, " (", from, ") for registry ", registry);
  if (!SafeHelperName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " names the credential helper '", name.substr(0, 64), "' for registry ", registry,
        ", which is not a plain name (letters, digits, '.', '_', '-')"));
  }
  auto answer = RunHelper(program, registry, what, timeout_ms);
  if (absl::IsNotFound(answer.status())) return RegistryCredentials{};
  if (!answer.ok()) return answer.status();
  auto j = ParseBoundedJson(*answer, what);
  const bool usable = j.ok() && j->is_object() && j->contains("Username") &&
                      j->contains("Secret") && (*j)["Username"].is_string() &&
                      (*j)["Secret"].is_string();
  if (!usable) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the answer is not a JSON object with string Username and Secret"));
  }
  const std::string user = (*j)["Username"].get<std::string>();
  const std::string secret = (*j)["Secret"].get<std::string>();
  RegistryCredentials c;
  if (user == kIdentityTokenUser) {
    c.identity_token = secret;
  } else if (user.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the Username holds a ':'"));
  } else {
    c.basic = evidence::Base64Encode(absl::StrCat(user, ":", secret));
  }
  return c;
}

}  // namespace

absl::StatusOr<RegistryCredentials> DockerCredentials(const std::string& registry,
                                                      const std::string& config_path,
                                                      long helper_timeout_ms) {
  io::SmallFileRules rules;
  rules.what = "Docker config file";
  rules.follow_link = true;
  auto text = io::ReadSmallFile(config_path, rules);
  if (absl::IsNotFound(text.status())) return RegistryCredentials{};
  if (!text.ok()) return text.status();
  auto j = ParseBoundedJson(*text, config_path);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return RegistryCredentials{};
  auto member = [&](const char* key, bool object) -> absl::StatusOr<const nlohmann::json*> {
    if (!j->contains(key)) return nullptr;
    const nlohmann::json& v = (*j)[key];
    if (object ? !v.is_object() : !v.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": `", key, "` is not ",
                                                     object ? "an object" : "a string"));
    }
    return &v;
  };
  // credHelpers[registry] > credsStore > auths[registry], as Docker looks them up.
  auto helpers = member("credHelpers", true);
  if (!helpers.ok()) return helpers.status();
  if (*helpers != nullptr) {
    for (const auto& [key, name] : (*helpers)->items()) {
      if (HostOf(key) != registry) continue;
      if (!name.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": credHelpers[\"", key, "\"] is not a string"));
      }
      return FromHelper(name.get<std::string>(), registry,
                        absl::StrCat("credHelpers[\"", key, "\"] of ", config_path),
                        helper_timeout_ms);
    }
  }
  auto store = member("credsStore", false);
  if (!store.ok()) return store.status();
  if (*store != nullptr && !(*store)->get<std::string>().empty()) {
    return FromHelper((*store)->get<std::string>(), registry,
                      absl::StrCat("credsStore of ", config_path), helper_timeout_ms);
  }
  auto auths = member("auths", true);
  if (!auths.ok()) return auths.status();
  if (*auths == nullptr) return RegistryCredentials{};
  for (const auto& [key, entry] : (*auths)->items()) {
    if (HostOf(key) != registry) continue;
    if (!entry.is_object()) continue;
    if (entry.contains("identitytoken") && entry["identitytoken"].is_string() &&
        !entry["identitytoken"].get<std::string>().empty()) {
      return RegistryCredentials{"", entry["identitytoken"].get<std::string>()};
    }
    if (!entry.contains("auth") || !entry["auth"].is_string()) continue;
    auto raw = evidence::Base64Decode(entry["auth"].get<std::string>());
    std::string pair = raw.ok() ? std::string(raw->begin(), raw->end()) : "";
    if (pair.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_path, ": auths[\"", key, "\"].auth is not base64 of user:password"));
    }
    return RegistryCredentials{evidence::Base64Encode(pair), ""};
  }
  return RegistryCredentials{};
}

}  // namespace ckpt::oci
