// SPDX-License-Identifier: BSD-2-Clause
// Consumer (consumer.h): how a consumer is driven and how it ends. Its owned thread's loop (Run),
// the engine's Drain with its notify fd, Shutdown's side: closing (CloseIfEmpty) and handing what
// is left to the orphan sink, and the control side's wait for a handler call in progress
// (CallInProgress, for Unregister). The dispatch itself is in consumer.cc.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "runtime/base/mutex.h"
#include "runtime/base/pinning.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"

namespace cqd::internal {

Status Consumer::Start() {
  if (options_.kind == ConsumerKind::kRunToCompletion) return Status::Ok();  // its poller runs it
  if (options_.kind == ConsumerKind::kEngineDriven) {
    if (engine_.fd < 0) return ErrnoStatus("consumer " + options_.name + ": eventfd", errno);
    return Status::Ok();
  }
  owned_.thread = std::thread([this] { Run(); });
  return Status::Ok();
}

void Consumer::Stop() {
  if (!owned_.thread.joinable()) return;
  owned_.stop.store(true, std::memory_order_seq_cst);
  parker_.Wake();
  owned_.thread.join();
}

void Consumer::Run() {
  PinAndNameThread(options_.cpu, "cqd-" + options_.name);
  using Clock = std::chrono::steady_clock;
  Clock::time_point idle_since;
  uint32_t idle_loops = 0;  // the clock is read once per 64 idle loops
  for (;;) {
    if (Dispatch(options_.dispatch_batch) > 0) {
      idle_loops = 0;
      continue;
    }
    if (owned_.stop.load(std::memory_order_acquire)) {
      if (CloseIfEmpty()) return;
      continue;  // items reserved but not yet visible: they are about to be
    }
    if (idle_loops++ % 64 != 0) {
      CpuRelax();
      continue;
    }
    Clock::time_point now = Clock::now();
    if (idle_loops == 1) {
      idle_since = now;
      continue;
    }
    if (now - idle_since < options_.idle_spin) continue;
    uint32_t ticket = parker_.Prepare();
    if (depth_.load(std::memory_order_seq_cst) > 0 || owned_.stop.load(std::memory_order_seq_cst)) {
      parker_.Cancel();
    } else {
      parker_.Park(ticket);
    }
    idle_loops = 0;
  }
}

bool Consumer::CloseIfEmpty() {
  MutexLock lock(owned_.close_mu);
  if (depth_.load(std::memory_order_seq_cst) != 0) return false;
  owned_.closed = true;  // PushIfOpen refuses from here: nobody would dispatch it
  return true;
}

// The notify fd counts two kinds of writes: a producer's Wake adds 1 (after taking the parker's
// sleeping flag), the consumer's own Signal adds kSelfToken. Drain knows which writes it is owed
// and reads the fd only then, after dispatching, so an engine spinning on Drain makes no system
// call until work arrives and none before handing that work to its handlers. It re-arms the
// parker only once it has read every write it is owed; re-arming earlier could leave a late
// write behind, a readable fd with nothing queued, and a level-triggered epoll spinning on it.
namespace {
constexpr uint64_t kSelfToken = uint64_t{1} << 32;
}  // namespace

void Consumer::Signal() noexcept {
  if (engine_.self_signaled) return;
  uint64_t token = kSelfToken;
  while (write(engine_.fd, &token, sizeof(token)) < 0 && errno == EINTR) {
  }
  engine_.self_signaled = true;
}

int Consumer::Drain(int max) noexcept {
  // One thread at a time (runtime.h): while another drains, this returns at once. Acquire and
  // release: a drainer sees everything the one before it wrote to this consumer's own state.
  uintptr_t idle = 0;
  if (!engine_.draining.compare_exchange_strong(idle, ThreadToken(), std::memory_order_acquire,
                                                std::memory_order_relaxed)) {
    return -EBUSY;
  }
  const int n = DrainHeld(max);
  engine_.draining.store(0, std::memory_order_release);
  return n;
}

int Consumer::DrainHeld(int max) noexcept {
  NoteDrainer();
  int n = Dispatch(max);
  if (engine_.armed && !parker_.sleeping()) {  // a producer took the arm: its write is owed
    engine_.armed = false;
    engine_.wake_owed = true;
  }
  if (engine_.wake_owed || engine_.self_signaled) {
    uint64_t value = 0;
    ssize_t got;
    while ((got = read(engine_.fd, &value, sizeof(value))) < 0 && errno == EINTR) {
    }
    if (got == sizeof(value)) {
      if (value % kSelfToken != 0) engine_.wake_owed = false;
      if (value / kSelfToken != 0) engine_.self_signaled = false;
    }
  }
  if (depth_.load(std::memory_order_seq_cst) > 0) {
    Signal();  // more is queued: keep the fd readable
    return n;
  }
  if (!engine_.armed && !engine_.wake_owed) {
    parker_.Prepare();  // from here a producer's Wake writes the fd
    engine_.armed = true;
    if (depth_.load(std::memory_order_seq_cst) > 0) {
      engine_.armed = false;
      if (!parker_.TryCancel()) engine_.wake_owed = true;  // a producer's Wake beat the cancel
      Signal();
    }
  }
  return n;
}

void Consumer::OrphanRemaining() noexcept {
  for (const auto& lane : lanes_) {
    const uint64_t handed = lane->HandedUpTo();
    const uint64_t recycled = lane->recycled();
    for (uint64_t pos = recycled; pos < handed; ++pos) OrphanLane(*lane, lane->IndexOf(pos), 1);
    if (handed > recycled) lane->Recycle(handed);
  }
  for (;;) {
    TakeQueuedItems();
    if (alone_.count == 0) return;
    for (size_t k = 0; k < alone_.count; ++k) {
      const Item& item = alone_.items[k];
      if (alone_.run[k]) continue;
      if (CarriesEvent(item.kind)) {
        Discard(item.kind, nullptr, item.join);
      } else {
        Discard(item.kind, &item.wc, nullptr);
      }
    }
    alone_.count = 0;
  }
}

void Consumer::OrphanLane(Lane& lane, uint32_t at, uint32_t n) noexcept {
  for (uint32_t i = at; i < at + n; ++i) {
    const EntryKind kind = lane.meta(i).kind;
    Discard(kind, &lane.wc(i), CarriesEvent(kind) ? lane.join(i) : nullptr);
  }
}

void Consumer::Discard(EntryKind kind, const ibv_wc* wc, EventJoin* join) noexcept {
  switch (Route(RouteStage::kNoConsumer, {.kind = kind})) {
    case Disposal::kOrphan:
      orphans_.Take({wc, 1});
      break;
    case Disposal::kDropEvent:
      if (kind == EntryKind::kListenerEvent) {
        EventJoin::DropHold(join);
      } else {
        DropEventPart(join, /*hand_on=*/false);  // no thread is left to run a CmHandler
      }
      break;
    case Disposal::kDropMarker:  // a teardown marker is the runtime's own
      break;
    case Disposal::kDeliver:  // never with no consumer left (route_test)
    case Disposal::kNoteMarker:
    case Disposal::kFenceTaken:
    case Disposal::kToFallback:  // the event thread's (never for an entry)
    case Disposal::kUnaffected:
      break;
  }
}

uint32_t Consumer::CallInProgress(uint32_t slot) const noexcept {
  if (DispatchingHere()) return 0;  // a handler of this consumer unregistering
  // The caller stored the dead state; after this fence the consumer either reads it or has
  // stored the slot where the load below finds it (see the header).
  HeavyFence();
  const uint32_t call = slot + 1;
  return calling_.load(std::memory_order_acquire) == call ? call : 0;
}

void Consumer::WaitForCallInProgress(uint32_t slot) const noexcept {
  const uint32_t call = CallInProgress(slot);
  if (call == 0) return;
  while (!CallOver(call)) WaitStep();  // thread_role.h
}

}  // namespace cqd::internal
