// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/poller_drive.cc: an engine-driven shard's driver protocol (poller.h): who drives
// (TryDrive, GiveBackDriver), a control call served by whoever holds or takes the driver
// (ServeIfFree), the engine's Step, and its sleep (PrepareSleep, EndSleep, one sleeper at a
// time). The pass itself is in poller.cc, the same for the thread and for the engine.
#include <unistd.h>

#include <cerrno>

#include "runtime/base/chaos.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/poller.h"

namespace cqd::internal {

void Poller::ServeIfFree() noexcept {
  if (!mailbox_.pending() || !TryDrive()) return;
  ServeAndGiveBack();
}

void Poller::GiveBackDriver() noexcept {
  driver_.store(0, std::memory_order_seq_cst);
  ChaosPoint();  // let go, mailbox not yet checked
  // A control call that found the driver taken relies on this check (the header comment).
  if (mailbox_.pending() && TryDrive()) ServeAndGiveBack();
}

void Poller::ServeAndGiveBack() noexcept {
  do {
    {
      const RuntimeThreadScope runtime(true);  // an OrphanHandler called here may not call in
      mailbox_.RunPosted();
    }
    parker_.Wake();  // the engine's next TrySleepShard arms what changed (a CQ added)
    driver_.store(0, std::memory_order_seq_cst);
  } while (mailbox_.pending() && TryDrive());
}

void Poller::EndSleep() noexcept {
  if (sleep_prepared_) {
    sleep_prepared_ = false;
    asleep_.store(false, std::memory_order_relaxed);
    if (!parker_.TryCancel()) wake_owed_ = true;  // a Wake got there first: its write comes
  }
  if (!wake_owed_) return;
  uint64_t value = 0;
  ssize_t got;
  while ((got = read(wake_fd_, &value, sizeof(value))) < 0 && errno == EINTR) {
  }
  if (got == sizeof(value)) wake_owed_ = false;  // else not written yet: read it next time
}

bool Poller::KickOtherSleeper() noexcept {
  if (!sleep_prepared_ || sleeper_ == ThreadToken()) return false;
  // Another thread sleeps on the fd: wake it (one write, unless a Wake already made it) and
  // leave the announcement and the fd to it, so that nothing it relies on is taken from it.
  parker_.Wake();
  GiveBackDriver();
  return true;
}

int Poller::Step(int budget) noexcept {
  if (driver_.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int work = 0;
  {
    const RuntimeThreadScope runtime(true);  // as on a poller: OrphanHandlers may not call in
    if (last_driver_.load(std::memory_order_relaxed) != ThreadToken()) {
      last_driver_.store(ThreadToken(), std::memory_order_relaxed);
    }
    EndSleep();
    if (mailbox_.pending()) mailbox_.RunPosted();
    work = stopped_.load(std::memory_order_relaxed) ? StepStopped() : Pass(budget);
  }
  GiveBackDriver();
  return work;
}

int Poller::StepStopped() noexcept {
  // As the thread does when it stops: dispatch what the hosted consumers hold, then close them.
  int work = 0;
  for (Consumer* consumer : hosted_) {
    const Lane& lane = *lanes_[consumer->index()];
    if (lane.spill_empty() && consumer->CloseIfEmpty()) continue;
    for (int round = 0; round < 4; ++round) {
      int n;
      {
        const HostedDispatchScope dispatching(&Poller::ServeMailbox, this);
        n = DispatchHosted(*consumer);
      }
      if (n == 0) break;
      work += n;
    }
  }
  return work;
}

int Poller::PrepareSleep() noexcept {
  if (driver_.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int verdict = 1;
  if (sleep_prepared_ && !parker_.sleeping()) {
    // Prepared, and a Wake took it since: the fd was written (an edge-triggered epoll may have
    // reported it already). Read it, and have the engine poll.
    EndSleep();
    verdict = 0;
  } else if (wake_owed_) {
    EndSleep();
  }
  if (verdict == 0 || sleep_prepared_ || wake_owed_) {
    // Still prepared with no Wake since (it writes the fd), or a write is still on its way
    // (the fd will be readable): sleeping stays safe; keep the bound of the first verdict.
    if (verdict != 0 && bounded_sleep_) verdict = 2;
    if (verdict != 0 && !sleep_prepared_) {
      // Sleeping on the write still on its way: this thread is the sleeper, as after any sleep,
      // so another thread's call is turned away (KickOtherSleeper: its Wake finds nothing to
      // take, and the write on its way wakes this one) until this one calls again, and does not
      // read the write this one sleeps on.
      sleep_prepared_ = true;
      sleeper_ = ThreadToken();
    }
  } else {
    bool busy;
    {
      const RuntimeThreadScope runtime(true);
      parker_.Prepare();  // from here a Wake writes the fd
      ChaosPoint();
      busy = stopped_.load(std::memory_order_relaxed) ? HostedPending() || mailbox_.pending()
                                                      : ArmAndRecheck();
    }
    if (busy) {
      if (!parker_.TryCancel()) wake_owed_ = true;
      verdict = 0;
    } else {
      // As the thread's bounded sleeps: a failed arm or channel (no event may come). The fd
      // still wakes it earlier.
      bounded_sleep_ = SleepMustBeBounded();
      sleep_prepared_ = true;
      // Stopped, nothing is armed or watched any more: idle, not asleep in the gauge's sense.
      if (!stopped_.load(std::memory_order_relaxed)) asleep_.store(true, std::memory_order_relaxed);
      sleeper_ = ThreadToken();
      verdict = bounded_sleep_ ? 2 : 1;
      Count(sleeps_, 1);
    }
  }
  GiveBackDriver();
  return verdict;
}

}  // namespace cqd::internal
