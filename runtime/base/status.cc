// SPDX-License-Identifier: BSD-2-Clause
#include "cqd/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cqd {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status ErrnoStatus(std::string_view what, int err) {
  char buf[128];
  const char* text = strerror_r(err, buf, sizeof(buf));  // GNU variant
  return Internal(std::string(what) + ": " + text);
}

void DieOnFailedResult(const Status& status) noexcept {
  // No allocation here: the message must come out even when memory is what ran out.
  const std::string_view code = StatusCodeName(status.code());
  std::fprintf(stderr, "cqd: Result::value() of a failed result: %.*s: %s\n",
               static_cast<int>(code.size()), code.data(), status.message().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cqd
