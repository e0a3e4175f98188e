// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/thread_role.h: tells the control path which runtime thread it is running on.
//
// Poller and event threads: inside an OrphanHandler or DeviceEventHandler, control calls are
// refused, because they hold the runtime mutex while they wait for those threads.
//
// A poller running run-to-completion handlers is the exception: there, control calls are made
// on the poller's own thread, inside a pass (the hosted stage, or a fused poll). Its "wait duty"
// is then set: any wait on this thread (for the runtime mutex, another runtime thread, or a batch
// in progress) keeps running what other threads posted to this shard's mailbox, so that a control
// call on another thread, which may hold the mutex and wait for this poller, still finishes. A
// call that would post to this very shard runs inline instead.
#ifndef CQD_RUNTIME_BASE_THREAD_ROLE_H_
#define CQD_RUNTIME_BASE_THREAD_ROLE_H_

#include <atomic>
#include <cstdint>
#include <thread>

#include "runtime/base/mutex.h"
#include "runtime/base/thread_annotations.h"

namespace cqd::internal {

inline thread_local bool tls_runtime_thread = false;

// Called once at the start of a poller or the event thread.
inline void MarkRuntimeThread() { tls_runtime_thread = true; }
inline bool OnRuntimeThread() { return tls_runtime_thread; }

// Makes this thread count as a runtime thread (`runtime` true: an engine thread driving a shard,
// an OrphanHandler called on a poller) or not (a run-to-completion handler on a poller) for the
// scope's life, then restores what it was.
class RuntimeThreadScope {
 public:
  explicit RuntimeThreadScope(bool runtime) noexcept : was_(tls_runtime_thread) {
    tls_runtime_thread = runtime;
  }
  ~RuntimeThreadScope() { tls_runtime_thread = was_; }
  RuntimeThreadScope(const RuntimeThreadScope&) = delete;
  RuntimeThreadScope& operator=(const RuntimeThreadScope&) = delete;

 private:
  const bool was_;
};

// Set while the engine's RuntimeOptions::log sink runs (log.cc): it may run under the runtime
// mutex, so control calls and waits from it are refused.
inline thread_local bool tls_in_log_sink = false;
inline bool InLogSink() { return tls_in_log_sink; }

// Counts the engine's callbacks that run on a thread none of the marks here names (an
// OrphanHandler or a CmHandler called on a control thread): Runtime::InCallback reads it.
inline thread_local int tls_callback_depth = 0;
class CallbackScope {
 public:
  CallbackScope() noexcept { ++tls_callback_depth; }
  ~CallbackScope() { --tls_callback_depth; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
};
inline bool InCallbackScope() { return tls_callback_depth > 0; }

// Names the calling thread: a number no other thread of the process ever gets (an address of a
// thread_local would be reused by a later thread).
inline uintptr_t ThreadToken() {
  static std::atomic<uintptr_t> next{1};
  static thread_local const uintptr_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

// The wait duty of this thread: `serve(owner)` runs what was posted to `owner`'s mailbox.
struct WaitDuty {
  void (*serve)(void* owner) = nullptr;
  const void* owner = nullptr;
};
inline thread_local WaitDuty tls_wait_duty;

inline bool HasWaitDuty() { return tls_wait_duty.serve != nullptr; }
// Returns true if this thread is `owner` serving run-to-completion handlers.
inline bool ServingAs(const void* owner) { return tls_wait_duty.owner == owner; }
// Run-to-completion handlers on a poller: for the scope's life this thread is no runtime thread
// (the handlers may call the runtime) and its waits serve `owner`'s mailbox; then both are
// restored.
class HostedDispatchScope {
 public:
  HostedDispatchScope(void (*serve)(void* owner), const void* owner) noexcept
      : runtime_(false), was_duty_(tls_wait_duty) {
    tls_wait_duty = {serve, owner};
  }
  ~HostedDispatchScope() { tls_wait_duty = was_duty_; }
  HostedDispatchScope(const HostedDispatchScope&) = delete;
  HostedDispatchScope& operator=(const HostedDispatchScope&) = delete;

 private:
  const RuntimeThreadScope runtime_;
  const WaitDuty was_duty_;
};

// One step of a wait: serve the duty, if any, then let others run.
inline void WaitStep() {
  if (tls_wait_duty.serve != nullptr) {
    tls_wait_duty.serve(const_cast<void*>(tls_wait_duty.owner));
  }
  std::this_thread::yield();
}

// The runtime's control mutex: a ticket lock, so callers take it in the order they asked
// (first come, first served). A thread with a wait duty spins for its turn and serves its duty
// at each step; any other thread sleeps on the turn counter (a futex).
//
// Why every Lock() finishes: each holder finishes its call (a holder that waits for a poller
// with a wait duty is served by that poller's spin), and turns pass strictly in ticket order, so
// no caller can be passed over by one that came later. An unfair mutex could not promise this: a
// thread making control calls back to back re-took it every time ahead of a hosted handler that
// only try_locks, and that handler's call did not finish while the other thread kept going.
//
// Memory order: taking a ticket is relaxed (it orders nothing); the turn is read with acquire and
// passed on with release, so a holder sees everything the one before it wrote.
class CQD_CAPABILITY("mutex") ControlMutex {
 public:
  void Lock() CQD_ACQUIRE() {
    const uint32_t ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
    if (HasWaitDuty()) {
      while (turn_.load(std::memory_order_acquire) != ticket) WaitStep();
      return;
    }
    for (uint32_t now = turn_.load(std::memory_order_acquire); now != ticket;
         now = turn_.load(std::memory_order_acquire)) {
      turn_.wait(now, std::memory_order_acquire);
    }
  }
  void Unlock() CQD_RELEASE_CAPABILITY() {
    turn_.fetch_add(1, std::memory_order_release);
    turn_.notify_all();
  }

 private:
  std::atomic<uint32_t> next_ticket_{0};
  std::atomic<uint32_t> turn_{0};
};

using ControlLock = ScopedLock<ControlMutex>;

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_THREAD_ROLE_H_
