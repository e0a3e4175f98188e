// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/log.h"

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

}  // namespace internal
}  // namespace cqd
