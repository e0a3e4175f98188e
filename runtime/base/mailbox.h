// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/mailbox.h: lets control-path threads run a function on a runtime thread and wait.
//
// The owner (a shard or the event thread) checks pending() once per loop, one seq_cst load (it
// pairs with the poster's seq_cst store and the owner's own sleep protocol), and calls
// RunPosted(). Once the owner has stopped (Close), RunSync runs the function inline on the
// caller, which is then the only thread touching the owner's state, marked as a runtime thread
// while it does (thread_role.h). A caller with a wait duty (thread_role.h) serves it while it
// waits.
#ifndef CQD_RUNTIME_BASE_MAILBOX_H_
#define CQD_RUNTIME_BASE_MAILBOX_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/base/mutex.h"
#include "runtime/base/thread_annotations.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {

class Mailbox {
 public:
  // Any thread but the owner: runs `fn` on the owner (after `wake_owner` nudges it) and returns
  // once it ran.
  void RunSync(const std::function<void()>& fn, const std::function<void()>& wake_owner)
      CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (!open_) {
      // In the stopped owner's place, and as it: the engine callbacks `fn` makes (an
      // OrphanHandler) have their control calls refused, as on the owner. The caller may hold the
      // runtime mutex, so a call let through would wait for itself.
      const RuntimeThreadScope as_owner(true);
      fn();
      return;
    }
    uint64_t ticket = ++posted_;
    posted_fns_.push_back(&fn);
    pending_.store(true, std::memory_order_seq_cst);
    lock.Unlock();
    wake_owner();
    lock.Lock();
    if (!HasWaitDuty()) {
      while (done_ < ticket) done_cv_.WaitForRecheck(mu_);
      return;
    }
    while (done_ < ticket) {
      lock.Unlock();
      WaitStep();
      lock.Lock();
    }
  }
  // Owner: true when RunPosted has work.
  bool pending() const noexcept { return pending_.load(std::memory_order_seq_cst); }
  // Owner: runs everything posted so far.
  void RunPosted() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    RunPostedLocked();
  }
  // Owner, when it starts and stops.
  void Open() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    open_ = true;
  }
  void Close() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    RunPostedLocked();
    open_ = false;
  }

 private:
  void RunPostedLocked() CQD_REQUIRES(mu_) {
    pending_.store(false, std::memory_order_relaxed);
    for (const std::function<void()>* fn : posted_fns_) (*fn)();
    done_ += posted_fns_.size();
    posted_fns_.clear();
    done_cv_.NotifyAll();
  }

  Mutex mu_;
  CondVar done_cv_;
  // Each waits in RunSync: stays alive.
  std::vector<const std::function<void()>*> posted_fns_ CQD_GUARDED_BY(mu_);
  uint64_t posted_ CQD_GUARDED_BY(mu_) = 0;
  uint64_t done_ CQD_GUARDED_BY(mu_) = 0;
  bool open_ CQD_GUARDED_BY(mu_) = false;
  std::atomic<bool> pending_{false};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_MAILBOX_H_
