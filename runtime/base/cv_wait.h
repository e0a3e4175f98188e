// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/cv_wait.h: waiting on a condition variable with the predicate re-checked now and
// then, because glibc before 2.41 can lose a wake-up (sourceware bug 25847: a waiter stays
// blocked after the notify that should have woken it). cqd found one such waiter blocked for good
// in Mailbox::RunSync with its part run (the chaos build, 2 CPUs); a re-check turns such a loss
// into one period's delay. Any thread; the caller holds `lock` as for std::condition_variable.
#ifndef CQD_RUNTIME_BASE_CV_WAIT_H_
#define CQD_RUNTIME_BASE_CV_WAIT_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace cqd::internal {

// How often a wait that is normally short (a control call waiting for its part) re-checks. A
// thread that idles for long sleeps on a Parker (parker.h) instead, which needs no re-check.
inline constexpr std::chrono::milliseconds kCvRecheck{1};

// Returns once `done()` holds (checked under `lock`).
template <typename Done>
void WaitRechecking(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Done done,
                    std::chrono::milliseconds recheck = kCvRecheck) {
  while (!cv.wait_for(lock, recheck, done)) {
  }
}

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_CV_WAIT_H_
