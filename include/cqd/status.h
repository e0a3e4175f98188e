// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/status.h: control-path error reporting.
///
/// Every control-path call of cqd (creating a runtime, CQs, registrations) returns a `Status` or a
/// `Result<T>` instead of throwing. A non-OK status always carries a message that names the bad
/// input, for example "RegisterQp: qp_num 18 is already registered".
///
/// Thread safety: these are plain values; copy them freely between threads.
#ifndef CQD_STATUS_H_
#define CQD_STATUS_H_

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "cqd/version.h"

namespace cqd {

/// What kind of outcome a Status reports.
enum class StatusCode {
  kOk = 0,              ///< success
  kInvalidArgument,     ///< the caller passed a value that can never work
  kNotFound,            ///< an id, CQ or QP the runtime does not know
  kAlreadyExists,       ///< for example registering a qp_num twice
  kFailedPrecondition,  ///< the wrong state or thread for the call (shut down, a wait refused)
  kResourceExhausted,   ///< a configured capacity is used up
  kUnavailable,         ///< the device failed (DEVICE_FATAL), or "not now, retry later"
                        ///< (RegisterQp on a number whose old completions are still held back)
  kInternal,            ///< a system or verbs call failed; the message carries errno
  kDeadlineExceeded,    ///< a wait ran out of time (for example a QP teardown that did not drain)
  kCancelled,           ///< the runtime shut down before the operation finished
};

/// Returns a stable name such as "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

/// The outcome of a control call: OK, or a code and a message that says what went wrong.
class [[nodiscard]] Status {
 public:
  Status() = default;  ///< OK
  /// A status of `code` with `message` (which names what failed and why).
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  /// Returns an OK status.
  static Status Ok() { return Status(); }

  /// Returns true for an OK status.
  bool ok() const { return code_ == StatusCode::kOk; }
  /// Returns the code (kOk for an OK status).
  StatusCode code() const { return code_; }
  /// Returns the message (empty for an OK status).
  const std::string& message() const { return message_; }
  /// Returns "OK" or "CODE: message".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// \name Status makers: each returns a status of its code with message `m`.
/// @{

/// Returns kInvalidArgument with `m`.
inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
/// Returns kNotFound with `m`.
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
/// Returns kAlreadyExists with `m`.
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
/// Returns kFailedPrecondition with `m`.
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
/// Returns kResourceExhausted with `m`.
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
/// Returns kUnavailable with `m`.
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
/// Returns kInternal with `m`.
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
/// Returns kDeadlineExceeded with `m`.
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
/// Returns kCancelled with `m`.
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
/// @}
/// Returns kInternal with "<what>: <strerror(err)>".
Status ErrnoStatus(std::string_view what, int err);

/// Result's way out when a failed result's value is asked for: writes "cqd: Result::value() of a
/// failed result: <status>" to stderr and aborts. Any thread.
[[noreturn]] void DieOnFailedResult(const Status& status) noexcept;

/// A value or a non-OK status.
///
/// value(), operator* and operator-> of a failed result are a programming error: in every build
/// mode they print the status ("cqd: Result::value() of a failed result: RESOURCE_EXHAUSTED: ...")
/// to stderr and abort the process. They never throw and never lose the message. Check ok() first
/// where a failure is expected. A Result built from an OK status holds no value: it is failed,
/// with an INTERNAL status that says so.
template <typename T>
class [[nodiscard]] Result {
 public:
  /// A result holding `value`.
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  /// A failed result with `status` (an OK status makes it kInternal).
  Result(Status status)  // NOLINT: implicit by design
      : v_(status.ok() ? Status(StatusCode::kInternal, "Result built from an OK status")
                       : std::move(status)) {}

  /// Returns true when a value is held.
  bool ok() const { return v_.index() == 0; }
  /// Returns OK when a value is held.
  Status status() const { return ok() ? Status() : *std::get_if<Status>(&v_); }
  /// Returns the value; aborts (DieOnFailedResult) if none is held.
  T& value() & { return *Checked(); }
  /// Returns the value; aborts (DieOnFailedResult) if none is held.
  const T& value() const& { return *Checked(); }
  /// Returns the value, moved out; aborts (DieOnFailedResult) if none is held.
  T&& value() && { return std::move(*Checked()); }
  /// Returns a pointer to the value; aborts (DieOnFailedResult) if none is held.
  T* operator->() { return Checked(); }
  /// Returns a pointer to the value; aborts (DieOnFailedResult) if none is held.
  const T* operator->() const { return Checked(); }
  /// Returns the value; aborts (DieOnFailedResult) if none is held.
  T& operator*() & { return *Checked(); }
  /// Returns the value; aborts (DieOnFailedResult) if none is held.
  const T& operator*() const& { return *Checked(); }

 private:
  T* Checked() {
    if (T* value = std::get_if<T>(&v_)) [[likely]]
      return value;
    DieOnFailedResult(*std::get_if<Status>(&v_));
  }
  const T* Checked() const {
    if (const T* value = std::get_if<T>(&v_)) [[likely]]
      return value;
    DieOnFailedResult(*std::get_if<Status>(&v_));
  }

  std::variant<T, Status> v_;
};

}  // namespace cqd

#endif  // CQD_STATUS_H_
