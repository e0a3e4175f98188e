// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "runtime/base/thread_role.h"

namespace cqd {

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

namespace internal {

void Logger::Log(LogLevel level, std::string_view message) const noexcept {
  if (!sink_) return;
  const bool outer = tls_in_log_sink;
  tls_in_log_sink = true;  // thread_role.h: the runtime refuses calls from the sink
  try {
    sink_(level, message);
  } catch (...) {  // the engine's sink must not take a runtime thread down
  }
  tls_in_log_sink = outer;
}

namespace {

// `text` in lower case (ASCII), for level names given in any case.
std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return lower;
}

// Returns true for the characters the environment's sink writes as \xNN.
bool NeedsEscape(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x20 || u == 0x7f || c == '\\';
}

// Where the lines go: stderr, or the file CQD_LOG_FILE names (appended to; closed with the sink).
std::shared_ptr<FILE> LogStream() {
  const char* path = std::getenv("CQD_LOG_FILE");
  if (path == nullptr || *path == '\0') return std::shared_ptr<FILE>(stderr, [](FILE*) {});
  FILE* file = std::fopen(path, "ae");
  if (file == nullptr) {
    std::fprintf(stderr, "cqd: CQD_LOG_FILE=%s cannot be opened (%s): logging to stderr\n", path,
                 std::strerror(errno));
    return std::shared_ptr<FILE>(stderr, [](FILE*) {});
  }
  std::setvbuf(file, nullptr, _IOLBF, 0);
  return std::shared_ptr<FILE>(file, [](FILE* f) { std::fclose(f); });
}

}  // namespace

std::function<void(LogLevel, std::string_view)> EnvironmentLogSink() {
  const char* value = std::getenv("CQD_LOG_LEVEL");
  std::string wanted = Lower(value == nullptr ? "" : value);
  // A log file asked for without a level: warnings and errors go there (the file is the ask).
  const char* file = std::getenv("CQD_LOG_FILE");
  if (wanted.empty() && file != nullptr && *file != '\0') wanted = "warning";
  if (wanted.empty() || wanted == "off") return {};
  std::optional<LogLevel> least;
  for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (LogLevelName(level) == wanted) least = level;
  }
  if (wanted == "warn") least = LogLevel::kWarning;  // UCX's and others' spelling
  if (!least) {
    std::fprintf(
        stderr,
        "cqd: CQD_LOG_LEVEL=%s is not one of debug, info, warning (warn), error, off: the log "
        "stays off\n",
        value);
    return {};
  }
  return [least = *least, out = LogStream()](LogLevel level, std::string_view message) {
    if (level < least) return;
    // One line per message, whatever the engine named things: control characters (a newline in
    // a consumer or device name, say) and the backslash are written as \xNN.
    std::string escaped;
    if (std::any_of(message.begin(), message.end(), NeedsEscape)) {
      escaped.reserve(message.size() + 16);
      for (const char c : message) {
        if (!NeedsEscape(c)) {
          escaped.push_back(c);
          continue;
        }
        char hex[5];
        std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
        escaped += hex;
      }
      message = escaped;
    }
    const std::string_view name = LogLevelName(level);
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    tm utc{};
    gmtime_r(&now.tv_sec, &utc);
    char when[32];
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &utc);
    // One call, so that concurrent messages do not interleave within a line.
    std::fprintf(out.get(), "cqd: %s.%06ldZ %d:%ld %.*s: %.*s\n", when, now.tv_nsec / 1000,
                 static_cast<int>(getpid()), static_cast<long>(gettid()),
                 static_cast<int>(name.size()), name.data(), static_cast<int>(message.size()),
                 message.data());
  };
}

}  // namespace internal
}  // namespace cqd
