// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/log.h"

#include <cstdio>
#include <cstdlib>
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

std::function<void(LogLevel, std::string_view)> EnvironmentLogSink() {
  const char* value = std::getenv("CQD_LOG_LEVEL");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "off") return {};
  std::optional<LogLevel> least;
  for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
    if (LogLevelName(level) == value) least = level;
  }
  if (std::string_view(value) == "warn") least = LogLevel::kWarning;  // UCX's and others' spelling
  if (!least) {
    std::fprintf(stderr,
                 "cqd: CQD_LOG_LEVEL=%s is not one of debug, info, warning, error, off: the log "
                 "stays off\n",
                 value);
    return {};
  }
  return [least = *least](LogLevel level, std::string_view message) {
    if (level < least) return;
    const std::string_view name = LogLevelName(level);
    // One call, so that concurrent messages do not interleave within a line.
    std::fprintf(stderr, "cqd: %.*s: %.*s\n", static_cast<int>(name.size()), name.data(),
                 static_cast<int>(message.size()), message.data());
  };
}

}  // namespace internal
}  // namespace cqd
