// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/log.h: the runtime's side of RuntimeOptions::log.
//
// Only control paths log: the thread making a control call, the event thread, the teardown
// thread and the stats thread; never from a shard's or consumer's data path (a handler's control
// call logs on its thread: a consumer's, or the hosting shard's for run to completion). Messages
// are built only when a sink is set (check enabled() before formatting anything costly). The sink
// is the engine's: a throw from it is swallowed so that it cannot take a runtime thread down.
#ifndef CQD_RUNTIME_BASE_LOG_H_
#define CQD_RUNTIME_BASE_LOG_H_

#include <functional>
#include <string_view>
#include <utility>

#include "cqd/options.h"

namespace cqd::internal {

class Logger {
 public:
  Logger() = default;
  explicit Logger(std::function<void(LogLevel, std::string_view)> sink) : sink_(std::move(sink)) {}

  bool enabled() const noexcept { return static_cast<bool>(sink_); }
  void Log(LogLevel level, std::string_view message) const noexcept;
  void Debug(std::string_view message) const noexcept { Log(LogLevel::kDebug, message); }
  void Info(std::string_view message) const noexcept { Log(LogLevel::kInfo, message); }
  void Warning(std::string_view message) const noexcept { Log(LogLevel::kWarning, message); }
  void Error(std::string_view message) const noexcept { Log(LogLevel::kError, message); }

 private:
  const std::function<void(LogLevel, std::string_view)> sink_;
};

// The sink RuntimeOptions::log stands for when the engine gives none: with CQD_LOG_LEVEL set in
// the environment to debug, info, warning (warn) or error, in any case, each message at that
// level or above goes out as one line,
//   "cqd: <UTC time, microseconds>Z <pid>:<tid> <level>: <message>"
// with the message's control characters and backslashes written as \xNN (a name an engine gave
// cannot start a line of its own)
// to stderr, or appended to the file CQD_LOG_FILE names (opened here, closed with the sink; one
// that cannot be opened is reported on stderr, and stderr is used). CQD_LOG_LEVEL unset, empty
// or "off": none (an empty function). Any other value is reported on stderr once per call and
// means off.
std::function<void(LogLevel, std::string_view)> EnvironmentLogSink();

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_LOG_H_
