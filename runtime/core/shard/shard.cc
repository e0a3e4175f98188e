// SPDX-License-Identifier: BSD-2-Clause
// Shard (shard.h): its stages put together, the thread that drives a runtime-owned shard, the
// pass, the sleep and the stats.
#include "runtime/core/shard/shard.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "runtime/base/chaos.h"
#include "runtime/base/check.h"
#include "runtime/base/pinning.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {
namespace {

using Clock = std::chrono::steady_clock;

bool HostsAny(const RuntimeOptions& options, int index) {
  return std::any_of(options.consumers.begin(), options.consumers.end(),
                     [&](const ConsumerOptions& c) {
                       return c.kind == ConsumerKind::kRunToCompletion && c.poller == index;
                     });
}

bool EngineDriven(const RuntimeOptions& options, int index) {
  return std::find(options.engine_shards.begin(), options.engine_shards.end(), index) !=
         options.engine_shards.end();
}

bool RecordsLatency(const RuntimeOptions& options) {
  return std::any_of(options.consumers.begin(), options.consumers.end(),
                     [](const ConsumerOptions& c) { return c.record_latency; });
}

}  // namespace

Shard::Shard(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
             const SlotPool& slots, OrphanSink& orphans)
    : index_(index),
      options_(options),
      slots_(slots),
      engine_driven_(EngineDriven(options, index)),
      spills_(index, consumers, options.poll_batch, /*hold=*/!engine_driven_),
      router_(options.poll_batch, RecordsLatency(options), fences_, orphans, spills_),
      fused_(HostsAny(options, index)
                 ? std::make_unique<FusedPoll>(options.poll_batch, counters_, spills_, router_,
                                               orphans, WaitDuty{&Shard::ServeMailbox, this})
                 : nullptr),
      cqs_(options, counters_, spills_, router_, fences_, fused_.get()),
      inbox_(counters_, spills_, cqs_, parker_),
      hosted_(spills_, WaitDuty{&Shard::ServeMailbox, this}) {
  if (engine_driven_) {
    engine_.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    parker_.UseEventFd(engine_.wake_fd);
  }
  for (size_t c = 0; c < consumers.size(); ++c) {
    consumers[c]->SetProducerParker(index_, &parker_);
    const ConsumerOptions& co = options.consumers[c];
    if (co.kind == ConsumerKind::kRunToCompletion && co.poller == index_) {
      consumers[c]->RunOnPoller(&parker_);
      hosted_.Add(consumers[c]);
      spills_.lane(static_cast<uint32_t>(c)).direct = true;
    }
  }
  fences_.Reserve(kFencesReserved);
}

Shard::~Shard() {
  Stop();
  if (engine_.wake_fd >= 0) close(engine_.wake_fd);
}

Status Shard::Start() {
  if (engine_driven_ && engine_.wake_fd < 0) {
    return ErrnoStatus("engine-driven shard " + std::to_string(index_) + ": eventfd", errno);
  }
  started_.store(true, std::memory_order_relaxed);
  mailbox_.Open();
  if (!engine_driven_) thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void Shard::Stop() {
  if (engine_driven_) {
    if (stopped_.load(std::memory_order_acquire) || engine_.wake_fd < 0) return;
    RunSync([this] {
      inbox_.Close();
      stopped_.store(true, std::memory_order_release);
    });
    parker_.Wake();  // the engine's next Step dispatches what its hosted consumers hold
    return;
  }
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  parker_.Wake();
  thread_.join();
}

void Shard::RunSync(const std::function<void()>& fn) {
#if CQD_DCHECKS_ON
  const std::function<void()> checked = [this, &fn] {
    CQD_DCHECK(OnDriver(), "a shard's control part ran off its driver thread");
    fn();
  };
  RunOnDriver(checked);
#else
  RunOnDriver(fn);
#endif
}

void Shard::RunOnDriver(const std::function<void()>& fn) {
  if (ServingAs(this)) {                      // a run-to-completion handler of this shard
    if (fused_ != nullptr) fused_->Settle();  // inside a fused poll: the rest is routed first
    fn();
    return;
  }
  if (engine_driven_) {
    // Run by this thread if nobody drives the shard, else by the driver before it lets go.
    mailbox_.RunSync(fn, [this] { ServeIfFree(); });
    return;
  }
  mailbox_.RunSync(fn, [this] { parker_.Wake(); });
}

void Shard::ServeMailbox(void* self) {
  Shard* shard = static_cast<Shard*>(self);
  if (!shard->mailbox_.pending()) return;
  if (shard->fused_ != nullptr) shard->fused_->Settle();
  shard->mailbox_.RunPosted();
}

bool Shard::OnDriver() const noexcept {
  const uintptr_t me = ThreadToken();
  if (engine_driven_) {
    return !started_.load(std::memory_order_relaxed) ||
           engine_.driver.load(std::memory_order_relaxed) == me;
  }
  const uintptr_t running = thread_token_.load(std::memory_order_relaxed);
  return running == 0 || running == me;
}

void Shard::Run() {
  MarkRuntimeThread();
  thread_token_.store(ThreadToken(), std::memory_order_relaxed);
  PinAndNameThread(options_.poller_cpus.empty() ? -1 : options_.poller_cpus[index_],
                   "cqd-poll" + std::to_string(index_));
  Clock::time_point idle_since;
  bool idle = false;
  for (;;) {
    if (mailbox_.pending()) mailbox_.RunPosted();
    if (stop_.load(std::memory_order_acquire)) break;
    if (Pass(INT32_MAX) > 0) {
      idle = false;
      continue;
    }
    if (options_.busy_poll) {
      if (!spills_.empty()) CpuRelax();  // waiting for a full consumer
      continue;
    }
    Clock::time_point now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    } else if (now - idle_since >= options_.idle_budget) {
      TrySleep();
      idle = false;
    }
  }
  inbox_.Close();
  hosted_.Close();
  // Before the mailbox closes: from then on a control call runs inline on its caller (the
  // mailbox's lock orders this store before it), which OnDriver must let through.
  thread_token_.store(0, std::memory_order_relaxed);
  mailbox_.Close();
}

int Shard::Pass(int budget) noexcept {
  CQD_DCHECK(OnDriver(), "a shard's pass ran off its driver thread");
  // Events first, so that each is placed behind its catch-up before more is polled; spills next,
  // so that room freed since the last pass is used before the CQs are polled for more; the hosted
  // consumers last, dispatching what this pass polled.
  int work = inbox_.Poll();
  work += spills_.Poll();
  work += cqs_.Poll(budget);
  work += hosted_.Poll();
  return work;
}

bool Shard::ArmAndRecheck() noexcept {
  CQD_DCHECK(OnDriver(), "a shard's sleep protocol ran off its driver thread");
  return !inbox_.TryEnterIdle() || !spills_.TryEnterIdle() || !cqs_.TryEnterIdle() ||
         !hosted_.TryEnterIdle() || mailbox_.pending();
}

void Shard::ExitIdle() noexcept {
  inbox_.ExitIdle();
  spills_.ExitIdle();
}

void Shard::TrySleep() noexcept {
  uint32_t ticket = parker_.Prepare();
  ChaosPoint();  // announced, not yet re-checked
  if (ArmAndRecheck() || stop_.load(std::memory_order_seq_cst)) {
    parker_.Cancel();
    return;
  }
  Count(counters_.sleeps, 1);
  counters_.asleep.store(true, std::memory_order_relaxed);
  if (cqs_.MustBoundSleep()) {
    parker_.ParkFor(ticket, kRecheckUnarmed);
  } else {
    parker_.Park(ticket);
  }
  counters_.asleep.store(false, std::memory_order_relaxed);
  ExitIdle();
}

PollerStats Shard::stats() const {
  PollerStats s;
  s.cpu = options_.poller_cpus.empty() || engine_driven_ ? -1 : options_.poller_cpus[index_];
  s.engine_driven = engine_driven_ ? 1 : 0;
  s.polls = counters_.polls.load(std::memory_order_relaxed);
  s.empty_polls = counters_.empty_polls.load(std::memory_order_relaxed);
  s.completions = counters_.completions.load(std::memory_order_relaxed);
  s.arms = counters_.arms.load(std::memory_order_relaxed);
  s.arm_failures = counters_.arm_failures.load(std::memory_order_relaxed);
  s.sleeps = counters_.sleeps.load(std::memory_order_relaxed);
  s.backpressure_stalls = counters_.backpressure_stalls.load(std::memory_order_relaxed);
  s.parks = counters_.parks.load(std::memory_order_relaxed);
  s.parked_cqs = counters_.parked_cqs.load(std::memory_order_relaxed);
  // Committed to a sleep, and no Wake has taken it since (a woken shard is about to run). The
  // announcement first (acquire): a later sleep's Prepare comes after the last one's asleep was
  // cleared, so asleep read true after it belongs to the sleep announced, past its re-check.
  const bool announced = parker_.sleeping();
  s.asleep = announced && counters_.asleep.load(std::memory_order_relaxed) ? 1 : 0;
  return s;
}

}  // namespace cqd::internal
