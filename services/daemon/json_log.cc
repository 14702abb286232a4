#include "services/daemon/json_log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/evidence/environment.h"
#include "core/text/json_dump.h"
#include "grpc/support/log.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kMaxWaitingBytes = size_t{1} << 20;

std::string FormatLine(std::string_view level, const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json line = {{"time", evidence::Rfc3339Now()}, {"level", level}};
  for (const auto& [k, v] : fields.items()) line[k] = v;
  std::string text = DumpJson(line);
  text += '\n';
  return text;
}

// Writes all of `text` to stderr, or what stderr takes of it before it refuses (its reader is
// gone: EPIPE, with SIGPIPE ignored, serving.h); the rest is lost.
void WriteStderr(std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// The lines waiting for stderr and the thread that writes them. Lines in the batch being
// written count towards the bound until written, so at most kMaxWaitingBytes are held.
class LineWriter {
 public:
  LineWriter() { std::thread([this] { Run(); }).detach(); }

  void Push(std::string line) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++pushed_;
      if (waiting_bytes_ + line.size() > kMaxWaitingBytes) {
        ++dropped_;
      } else {
        waiting_bytes_ += line.size();
        lines_.push_back(std::move(line));
      }
    }
    wake_.notify_one();
  }

  void Flush(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = pushed_;
    done_.wait_for(lock, timeout, [&] { return handled_ >= target; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return !lines_.empty() || dropped_ > 0; });
      std::deque<std::string> batch;
      batch.swap(lines_);
      const uint64_t dropped = std::exchange(dropped_, 0);
      lock.unlock();
      std::string text;
      size_t bytes = 0;
      for (const std::string& line : batch) bytes += line.size();
      text.reserve(bytes);
      for (const std::string& line : batch) text += line;
      if (dropped > 0) {
        text += FormatLine("warn", {{"msg", "log lines dropped"},
                                    {"dropped", dropped},
                                    {"why", "stderr was not read fast enough"}});
      }
      WriteStderr(text);
      lock.lock();
      waiting_bytes_ -= bytes;
      handled_ += batch.size() + dropped;
      done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<std::string> lines_;
  size_t waiting_bytes_ = 0;
  uint64_t pushed_ = 0, handled_ = 0, dropped_ = 0;
};

// Never destroyed: its thread may be blocked writing when the process exits.
LineWriter& Writer() {
  static LineWriter* writer = new LineWriter;
  return *writer;
}

std::atomic<bool> g_listener_failed{false};

void LogGrpcMessage(gpr_log_func_args* args) {
  if (std::string_view(args->message).rfind("Failed accept", 0) == 0) {
    g_listener_failed.store(true);
  }
  const char* level = args->severity == GPR_LOG_SEVERITY_ERROR  ? "error"
                      : args->severity == GPR_LOG_SEVERITY_INFO ? "info"
                                                                : "debug";
  LogJson(level, {{"msg", args->message},
                  {"source", std::string(args->file) + ":" + std::to_string(args->line)}});
}

}  // namespace

void LogJson(std::string_view level, const nlohmann::ordered_json& fields) {
  Writer().Push(FormatLine(level, fields));
}

void FlushJsonLog(std::chrono::milliseconds timeout) { Writer().Flush(timeout); }

void RouteGrpcLogsToJson() { gpr_set_log_function(LogGrpcMessage); }

bool GrpcListenerFailed() { return g_listener_failed.load(); }

}  // namespace ckpt::daemon
