#include "runtime/log.h"

namespace cqd {

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

namespace internal {

void Logger::Log(LogLevel level, std::string_view message) const noexcept {
  if (!sink_) return;
  try {
    sink_(level, message);
  } catch (...) {  // the engine's sink must not take a runtime thread down
  }
}

}  // namespace internal
}  // namespace cqd
