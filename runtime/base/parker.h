// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/parker.h: puts one thread to sleep until another has work for it, without lost
// wakeups.
//
// One sleeper, any number of wakers. The sleeper calls Prepare(), re-checks for work, then either
// Cancel()s or Park()s; a waker publishes work with a seq_cst operation and then calls Wake().
// Because Prepare's store and Wake's load are seq_cst, either the waker sees the sleeper (and
// wakes it) or the sleeper's re-check sees the work. Wake costs one load when nobody sleeps.
//
// The wake goes through a futex, or, with UseEventFd(), an eventfd the sleeper watches in its own
// epoll set (engine-driven consumers): then Park() and ParkFor() are not used.
#ifndef CQD_RUNTIME_BASE_PARKER_H_
#define CQD_RUNTIME_BASE_PARKER_H_

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <ctime>

#include "runtime/base/chaos.h"

namespace cqd::internal {

class Parker {
 public:
  void UseEventFd(int fd) { event_fd_ = fd; }

  // Sleeper: announces the intent to sleep; returns the ticket to pass to Park.
  uint32_t Prepare() noexcept {
    uint32_t ticket = seq_.load(std::memory_order_acquire);
    sleeping_.store(true, std::memory_order_seq_cst);
    return ticket;
  }
  // Sleeper: the re-check found work.
  void Cancel() noexcept { sleeping_.store(false, std::memory_order_relaxed); }
  // Sleeper: as Cancel; returns false if a waker got there first (and so wakes, or has woken).
  bool TryCancel() noexcept { return sleeping_.exchange(false, std::memory_order_acq_rel); }
  // Sleeper: blocks until a Wake() after Prepare() returned `ticket`.
  void Park(uint32_t ticket) noexcept {
    while (seq_.load(std::memory_order_acquire) == ticket) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAIT_PRIVATE, ticket, nullptr,
              nullptr, 0);
    }
    sleeping_.store(false, std::memory_order_relaxed);
  }
  // Sleeper: as Park, but returns after `timeout` at the latest.
  void ParkFor(uint32_t ticket, std::chrono::nanoseconds timeout) noexcept {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
                static_cast<long>(timeout.count() % 1000000000)};
    if (seq_.load(std::memory_order_acquire) == ticket) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAIT_PRIVATE, ticket, &ts,
              nullptr, 0);
    }
    sleeping_.store(false, std::memory_order_relaxed);
  }
  // Waker: returns true if it woke the sleeper (exactly one concurrent waker does).
  bool Wake() noexcept {
    ChaosPoint();  // the work published, the sleeper not yet looked at
    if (!sleeping_.load(std::memory_order_seq_cst)) return false;
    if (!sleeping_.exchange(false, std::memory_order_acq_rel)) return false;
    ChaosPoint();  // taken, not yet written: the sleeper's cancel fails and the write is owed
    seq_.fetch_add(1, std::memory_order_release);
    if (event_fd_ >= 0) {
      uint64_t one = 1;  // any non-zero count makes the eventfd readable
      while (write(event_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
      }
    } else {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq_), FUTEX_WAKE_PRIVATE, 1, nullptr,
              nullptr, 0);
    }
    return true;
  }
  // Acquire: a true read follows the Prepare that stored it, and what its thread did before.
  bool sleeping() const noexcept { return sleeping_.load(std::memory_order_acquire); }

 private:
  alignas(64) std::atomic<uint32_t> seq_{0};
  std::atomic<bool> sleeping_{false};
  int event_fd_ = -1;
};

inline void CpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  asm volatile("" ::: "memory");
#endif
}

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_PARKER_H_
