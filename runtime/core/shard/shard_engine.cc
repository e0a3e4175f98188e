// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/shard_engine.cc: the driver of an engine-driven shard (shard.h): who drives,
// a control call served by whoever holds or takes the driver, the engine's Step, and its sleep.
// The pass and the sleep's re-check are shard.cc's, the same for the thread and the engine.
//
// The shard's state belongs to whichever thread holds `engine_.driver` (a compare-and-swap from 0
// to its ThreadToken, seq_cst): the engine inside Step or PrepareSleep, or a control thread. A
// control call posts its part to the mailbox and then tries to take the driver itself and run it
// (ServeIfFree); if the engine holds it, the engine runs it before it lets go: GiveBackDriver
// stores 0 and then checks the mailbox (both seq_cst), so either the control thread's CAS sees
// the driver free or the engine sees the post. A handler of the shard waiting for the runtime
// serves the mailbox as on a thread (the wait duty). So no control call waits for the engine to
// come back, only for a Step in progress. Every control part run this way, and Stop, writes the
// fd if the engine prepared to sleep: a CQ added meanwhile is armed by the next PrepareSleep.
// Where the thread would sleep only briefly (a failed arm, broken notifications) PrepareSleep
// says so (2). One thread sleeps at a time: a Step or PrepareSleep of another thread meanwhile
// wakes it and returns 0, so that it never cancels or reads what the sleeper relies on. After
// Stop the engine's Steps dispatch what the hosted consumers still hold and close them.
#include <unistd.h>

#include <cerrno>

#include "runtime/base/chaos.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {

bool Shard::TryDrive() noexcept {
  ChaosPoint();
  uintptr_t none = 0;
  return engine_.driver.compare_exchange_strong(none, ThreadToken(), std::memory_order_seq_cst);
}

void Shard::ServeIfFree() noexcept {
  if (!mailbox_.pending() || !TryDrive()) return;
  ServeAndGiveBack();
}

void Shard::GiveBackDriver() noexcept {
  engine_.driver.store(0, std::memory_order_seq_cst);
  ChaosPoint();  // let go, mailbox not yet checked
  // A control call that found the driver taken relies on this check (the header comment).
  if (mailbox_.pending() && TryDrive()) ServeAndGiveBack();
}

void Shard::ServeAndGiveBack() noexcept {
  do {
    {
      const RuntimeThreadScope runtime(true);  // an OrphanHandler called here may not call in
      mailbox_.RunPosted();
    }
    parker_.Wake();  // the engine's next TrySleepShard arms what changed (a CQ added)
    engine_.driver.store(0, std::memory_order_seq_cst);
  } while (mailbox_.pending() && TryDrive());
}

void Shard::EndSleep() noexcept {
  if (engine_.sleep_prepared) {
    engine_.sleep_prepared = false;
    counters_.asleep.store(false, std::memory_order_relaxed);
    if (!parker_.TryCancel()) engine_.wake_owed = true;  // a Wake got there first: its write comes
    ExitIdle();
  }
  if (!engine_.wake_owed) return;
  uint64_t value = 0;
  ssize_t got;
  while ((got = read(engine_.wake_fd, &value, sizeof(value))) < 0 && errno == EINTR) {
  }
  if (got == sizeof(value)) engine_.wake_owed = false;  // else not written yet: read it next time
}

bool Shard::KickOtherSleeper() noexcept {
  if (!engine_.sleep_prepared || engine_.sleeper == ThreadToken()) return false;
  // Another thread sleeps on the fd: wake it (one write, unless a Wake already made it) and
  // leave the announcement and the fd to it, so that nothing it relies on is taken from it.
  parker_.Wake();
  GiveBackDriver();
  return true;
}

int Shard::Step(int budget) noexcept {
  if (engine_.driver.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int work = 0;
  {
    const RuntimeThreadScope runtime(true);  // as on a poller: OrphanHandlers may not call in
    if (engine_.last_driver.load(std::memory_order_relaxed) != ThreadToken()) {
      engine_.last_driver.store(ThreadToken(), std::memory_order_relaxed);
    }
    EndSleep();
    if (mailbox_.pending()) mailbox_.RunPosted();
    work = stopped_.load(std::memory_order_relaxed) ? hosted_.CloseStep() : Pass(budget);
  }
  GiveBackDriver();
  return work;
}

int Shard::PrepareSleep() noexcept {
  if (engine_.driver.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int verdict = 1;
  if (engine_.sleep_prepared && !parker_.sleeping()) {
    // Prepared, and a Wake took it since: the fd was written (an edge-triggered epoll may have
    // reported it already). Read it, and have the engine poll.
    EndSleep();
    verdict = 0;
  } else if (engine_.wake_owed) {
    EndSleep();
  }
  if (verdict == 0 || engine_.sleep_prepared || engine_.wake_owed) {
    // Still prepared with no Wake since (it writes the fd), or a write is still on its way
    // (the fd will be readable): sleeping stays safe; keep the bound of the first verdict.
    if (verdict != 0 && engine_.bounded_sleep) verdict = 2;
    if (verdict != 0 && !engine_.sleep_prepared) {
      // Sleeping on the write still on its way: this thread is the sleeper, as after any sleep,
      // so another thread's call is turned away (KickOtherSleeper: its Wake finds nothing to
      // take, and the write on its way wakes this one) until this one calls again, and does not
      // read the write this one sleeps on.
      engine_.sleep_prepared = true;
      engine_.sleeper = ThreadToken();
    }
  } else {
    bool busy;
    {
      const RuntimeThreadScope runtime(true);
      parker_.Prepare();  // from here a Wake writes the fd
      ChaosPoint();
      busy = stopped_.load(std::memory_order_relaxed) ? hosted_.Pending() || mailbox_.pending()
                                                      : ArmAndRecheck();
    }
    if (busy) {
      if (!parker_.TryCancel()) engine_.wake_owed = true;
      verdict = 0;
    } else {
      // As the thread's bounded sleeps: a failed arm or channel (no event may come). The fd
      // still wakes it earlier.
      engine_.bounded_sleep = cqs_.MustBoundSleep();
      engine_.sleep_prepared = true;
      // Stopped, nothing is armed or watched any more: idle, not asleep in the gauge's sense.
      if (!stopped_.load(std::memory_order_relaxed))
        counters_.asleep.store(true, std::memory_order_relaxed);
      engine_.sleeper = ThreadToken();
      verdict = engine_.bounded_sleep ? 2 : 1;
      Count(counters_.sleeps, 1);
    }
  }
  GiveBackDriver();
  return verdict;
}

}  // namespace cqd::internal
