// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/mailbox.h: lets control-path threads run a function on a runtime thread and wait.
//
// The owner (a poller or the event thread) checks pending() once per loop, one seq_cst load (it
// pairs with the poster's seq_cst store and the owner's own sleep protocol), and calls
// RunPosted(). Once the owner has stopped (Close), RunSync runs the function inline on the
// caller, which is then the only thread touching the owner's state, marked as a runtime thread
// while it does (thread_role.h). A caller with a wait duty (thread_role.h) serves it while it
// waits.
#ifndef CQD_RUNTIME_BASE_MAILBOX_H_
#define CQD_RUNTIME_BASE_MAILBOX_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/base/cv_wait.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {

class Mailbox {
 public:
  // Any thread but the owner: runs `fn` on the owner (after `wake_owner` nudges it) and returns
  // once it ran.
  void RunSync(const std::function<void()>& fn, const std::function<void()>& wake_owner) {
    std::unique_lock<std::mutex> lock(mu_);
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
    lock.unlock();
    wake_owner();
    lock.lock();
    if (!HasWaitDuty()) {
      WaitRechecking(done_cv_, lock, [&] { return done_ >= ticket; });  // cv_wait.h
      return;
    }
    while (done_ < ticket) {
      lock.unlock();
      WaitStep();
      lock.lock();
    }
  }
  // Owner: true when RunPosted has work.
  bool pending() const noexcept { return pending_.load(std::memory_order_seq_cst); }
  // Owner: runs everything posted so far.
  void RunPosted() {
    std::lock_guard<std::mutex> lock(mu_);
    RunPostedLocked();
  }
  // Owner, when it starts and stops.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    RunPostedLocked();
    open_ = false;
  }

 private:
  void RunPostedLocked() {
    pending_.store(false, std::memory_order_relaxed);
    for (const std::function<void()>* fn : posted_fns_) (*fn)();
    done_ += posted_fns_.size();
    posted_fns_.clear();
    done_cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<const std::function<void()>*> posted_fns_;  // each waits in RunSync: stays alive
  uint64_t posted_ = 0;
  uint64_t done_ = 0;
  bool open_ = false;
  std::atomic<bool> pending_{false};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_MAILBOX_H_
