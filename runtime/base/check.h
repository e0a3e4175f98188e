// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/check.h: CQD_DCHECK, an internal invariant asserted in debug builds (no NDEBUG:
// Bazel's fastbuild, the sanitizer builds) and in the chaos build, and compiled out of a release.
//
// A failed check prints where and what to stderr and aborts: it marks a bug of cqd's own (a
// contract between its threads broken), never bad input, which gets a Status. Any thread.
#ifndef CQD_RUNTIME_BASE_CHECK_H_
#define CQD_RUNTIME_BASE_CHECK_H_

#include <cstdio>
#include <cstdlib>

#if !defined(NDEBUG) || defined(CQD_CHAOS)
#define CQD_DCHECKS_ON 1
#else
#define CQD_DCHECKS_ON 0
#endif

namespace cqd::internal {

[[noreturn]] inline void DcheckFailed(const char* file, int line, const char* condition,
                                      const char* what) noexcept {
  std::fprintf(stderr, "cqd: internal check failed at %s:%d: %s (%s)\n", file, line, condition,
               what);
  std::fflush(stderr);
  std::abort();
}

}  // namespace cqd::internal

#if CQD_DCHECKS_ON
#define CQD_DCHECK(condition, what)                                                        \
  do {                                                                                     \
    if (!(condition)) ::cqd::internal::DcheckFailed(__FILE__, __LINE__, #condition, what); \
  } while (false)
#else
#define CQD_DCHECK(condition, what) \
  do {                              \
  } while (false)
#endif

#endif  // CQD_RUNTIME_BASE_CHECK_H_
