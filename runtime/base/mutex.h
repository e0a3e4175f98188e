// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/mutex.h: the runtime's mutex, its scoped holder and its condition variable, each
// annotated for Clang's thread-safety analysis (thread_annotations.h).
//
// Any thread may use them. Mutex is std::mutex (Lock acquires, Unlock releases: what one holder
// wrote, the next holder sees). CondVar waits release the mutex and take it again before they
// return; a notify made with or after a change under the mutex wakes the waiters that checked the
// old state under it. Wait loops re-check their condition at least every kCvRecheck: glibc before
// 2.41 can lose a wake-up (sourceware bug 25847: a waiter stays blocked after the notify that
// should have woken it; cqd once found a control call blocked for good in Mailbox::RunSync with
// its part run, under the chaos build on 2 CPUs), and a re-check turns such a loss into one
// period's delay. A thread that idles for long sleeps on a Parker (parker.h) instead, which
// needs no re-check.
#ifndef CQD_RUNTIME_BASE_MUTEX_H_
#define CQD_RUNTIME_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "runtime/base/thread_annotations.h"

namespace cqd::internal {

// How often a wait that is normally short (a control call waiting for its part) re-checks.
inline constexpr std::chrono::milliseconds kCvRecheck{1};

class CQD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() CQD_ACQUIRE() { mu_.lock(); }
  void Unlock() CQD_RELEASE_CAPABILITY() { mu_.unlock(); }
  // Returns true if it took the mutex.
  bool TryLock() CQD_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `M` (Mutex, ControlMutex, a SpinLock: anything with Lock and Unlock) for its scope. Unlock
// and Lock give it up and take it again inside the scope; the destructor gives it up if held.
template <typename M>
class CQD_SCOPED_CAPABILITY ScopedLock {
 public:
  explicit ScopedLock(M& mu) CQD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~ScopedLock() CQD_RELEASE_CAPABILITY() {
    if (held_) mu_.Unlock();
  }
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;

  void Unlock() CQD_RELEASE_CAPABILITY() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() CQD_ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  M& mu_;
  bool held_ = true;
};
using MutexLock = ScopedLock<Mutex>;

class CondVar {
 public:
  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }
  // Releases `mu`, blocks until notified (or spuriously) or `timeout` passed, and takes `mu`
  // again. Callers loop on their condition: use WaitForRecheck below unless a longer period is
  // meant.
  template <typename Rep, typename Period>
  void WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout) CQD_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait_for(lock, timeout);
    lock.release();  // still held: the caller's
  }
  // One step of a wait loop: `while (!condition) cv.WaitForRecheck(mu);`.
  void WaitForRecheck(Mutex& mu) CQD_REQUIRES(mu) { WaitFor(mu, kCvRecheck); }

 private:
  std::condition_variable cv_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_MUTEX_H_
