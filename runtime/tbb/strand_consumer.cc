// SPDX-License-Identifier: BSD-2-Clause
// StrandConsumer (cqd/tbb.h): one engine-driven consumer drained by an ArenaDrainer, whose QPs
// are registered with a Strand (strand.h) that queues what the runtime hands it and delivers it
// to the user's handler from strand tasks. This file holds the public side: registration,
// teardown, Stop and the stats.
#include <chrono>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "cqd/tbb.h"
#include "runtime/base/mutex.h"
#include "runtime/tbb/arena_drainer.h"
#include "runtime/tbb/strand.h"

namespace cqd {

using internal::Strand;
using internal::StrandCore;
using internal::TaskScope;

namespace {

// Unregisters the strands handed over by StrandRegistration::HandOver, where this thread may.
void UnregisterHandedOver(StrandCore& core) noexcept {
  std::vector<std::shared_ptr<Strand>> strands;
  {
    internal::MutexLock lock(core.mu);
    if (core.handed_over.empty()) return;
    strands.swap(core.handed_over);
  }
  for (std::shared_ptr<Strand>& strand : strands) {
    strand->registration.Unregister();
    if (!strand->registration.registered()) {
      strand->Kill();
      continue;
    }
    internal::MutexLock lock(core.mu);  // a poller or the event thread again: later
    try {
      core.handed_over.push_back(std::move(strand));
    } catch (const std::bad_alloc&) {
      (void)new (std::nothrow) std::shared_ptr<Strand>(std::move(strand));  // kept, never freed
    }
  }
}

}  // namespace

StrandRegistration& StrandRegistration::operator=(StrandRegistration&& other) noexcept {
  if (this != &other) {
    Unregister();
    HandOver();
    strand_ = std::move(other.strand_);
    qp_num_ = other.qp_num_;
  }
  return *this;
}

StrandRegistration::~StrandRegistration() {
  Unregister();
  HandOver();
}

void StrandRegistration::Unregister() noexcept {
  if (strand_ == nullptr) return;
  strand_->registration.Unregister();              // the wrapper is never called after this...
  if (strand_->registration.registered()) return;  // ...unless it was refused: see HandOver
  std::shared_ptr<Strand> strand = std::move(strand_);
  strand_ = nullptr;
  strand->Kill();
}

void StrandRegistration::HandOver() noexcept {
  if (strand_ == nullptr) return;
  // Still registered (a poller or the event thread): the runtime may call the strand, so it
  // must not be freed here.
  std::shared_ptr<Strand> strand = std::move(strand_);
  strand_ = nullptr;
  StrandCore& core = *strand->core;
  internal::MutexLock lock(core.mu);
  try {
    core.handed_over.push_back(std::move(strand));
  } catch (const std::bad_alloc&) {
    (void)new (std::nothrow) std::shared_ptr<Strand>(std::move(strand));  // kept, never freed
  }
}

bool StrandTeardown::done() const {
  return state_ != nullptr && state_->done.load(std::memory_order_acquire);
}

Status StrandTeardown::Wait() const {
  if (state_ == nullptr) {
    return FailedPrecondition("StrandTeardown::Wait: a default-constructed StrandTeardown");
  }
  {
    internal::MutexLock lock(state_->mu);
    if (state_->finished) return state_->result;  // any thread
  }
  if (Status refused = internal::RefuseWaitInCallback("StrandTeardown::Wait"); !refused.ok()) {
    return FailedPrecondition(refused.message() + ": use TeardownOptions::on_done");
  }
  internal::MutexLock lock(state_->mu);
  // Re-checked: glibc before 2.41 can lose a condition variable's wake-up (mutex.h).
  while (!state_->finished) state_->cv.WaitForRecheck(state_->mu);
  return state_->result;
}

namespace {

// StrandConsumer::Stop past its refusal (the destructor's too).
Status StopAndDeliver(Runtime& runtime, StrandCore& core, internal::ArenaDrainer& drainer) {
  internal::MutexLock stop_lock(core.stop_mu);
  if (Status s = drainer.Stop(); !s.ok()) return s;
  if (core.stopped.load(std::memory_order_acquire)) return Status::Ok();
  // What the consumer still holds goes to the strands, on this thread: no drain task runs now,
  // but a strand's user handler may be draining it (-EBUSY): wait for that Drain to end, then go
  // on. It ends: a strand task never waits for Stop.
  for (;;) {
    const int n = runtime.Drain(core.consumer, core.drain_budget);
    if (n > 0) continue;
    if (n != -EBUSY) break;
    std::this_thread::yield();
  }
  internal::WaitForZero(core.inflight);
  {
    // From here a push finds `stopped` (the lock of each live strand orders it with the pushes
    // that did not), so no strand task starts after the wait below.
    internal::MutexLock lock(core.mu);
    core.stopped.store(true, std::memory_order_release);
    for (Strand* strand : core.live) {
      internal::ScopedLock<internal::SpinLock> strand_lock(strand->mu);
    }
  }
  internal::WaitForZero(core.inflight);
  drainer.Unhost();
  return Status::Ok();
}

}  // namespace

StrandConsumer::StrandConsumer(Runtime& runtime, std::shared_ptr<StrandCore> core,
                               std::unique_ptr<internal::ArenaDrainer> drainer)
    : runtime_(runtime), core_(std::move(core)), drainer_(std::move(drainer)) {}

Result<std::unique_ptr<StrandConsumer>> StrandConsumer::Create(
    Runtime& runtime, ::tbb::task_arena& arena, const StrandConsumerOptions& options) {
  try {
    if (options.strand_budget < 1 || options.strand_budget > (1 << 20)) {
      return InvalidArgument("StrandConsumer::Create: strand_budget " +
                             std::to_string(options.strand_budget) + " is not in 1..1048576");
    }
    auto core = std::make_shared<StrandCore>();
    core->runtime = &runtime;
    core->arena = &arena;
    core->consumer = options.consumer;
    core->drain_budget = options.drain_budget;
    core->strand_budget = options.strand_budget;
    core->orphan_handler = options.orphan_handler;
    auto drainer = internal::ArenaDrainer::Create(
        runtime, arena, {options.consumer}, options.watcher_thread, options.drain_budget,
        std::chrono::microseconds(0), "StrandConsumer::Create");
    if (!drainer.ok()) return drainer.status();
    return std::unique_ptr<StrandConsumer>(
        new StrandConsumer(runtime, std::move(core), std::move(drainer).value()));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("StrandConsumer::Create: out of memory");
  }
}

StrandConsumer::~StrandConsumer() {
  UnregisterHandedOver(*core_);
  if (!TaskScope::InTaskOf(core_.get())) (void)StopAndDeliver(runtime_, *core_, *drainer_);
}

template <typename Register>
Result<StrandRegistration> StrandConsumer::RegisterWith(QpHandler& handler,
                                                        const Register& register_qp) {
  UnregisterHandedOver(*core_);
  try {
    auto strand = std::make_shared<Strand>(core_, &handler);
    {
      internal::MutexLock lock(core_->mu);
      if (core_->stopped.load(std::memory_order_relaxed)) {
        return FailedPrecondition("StrandConsumer::RegisterQp: the StrandConsumer was stopped");
      }
      core_->live.insert(strand.get());
    }
    Result<Registration> registration = register_qp(static_cast<QpHandler&>(*strand));
    if (!registration.ok()) return registration.status();  // ~Strand leaves the live set
    StrandRegistration out;
    out.qp_num_ = registration->qp_num();
    strand->registration = std::move(registration).value();
    out.strand_ = std::move(strand);
    return out;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("StrandConsumer::RegisterQp: out of memory");
  }
}

Result<StrandRegistration> StrandConsumer::RegisterQp(ibv_qp* qp, QpHandler& handler,
                                                      const QpOptions& options) {
  return RegisterWith(handler, [&](QpHandler& wrapper) {
    return runtime_.RegisterQp(qp, wrapper, core_->consumer, options);
  });
}

Result<StrandRegistration> StrandConsumer::RegisterQp(const SimQp& qp, QpHandler& handler,
                                                      const QpOptions& options) {
  return RegisterWith(handler, [&](QpHandler& wrapper) {
    return runtime_.RegisterQp(qp, wrapper, core_->consumer, options);
  });
}

Result<StrandRegistration> StrandConsumer::RegisterQp(rdma_cm_id* id, QpHandler& handler,
                                                      const QpOptions& options) {
  return RegisterWith(handler, [&](QpHandler& wrapper) {
    return runtime_.RegisterQp(id, wrapper, core_->consumer, options);
  });
}

Result<StrandTeardown> StrandConsumer::TeardownQp(StrandRegistration& registration,
                                                  const TeardownOptions& options) {
  UnregisterHandedOver(*core_);
  try {
    if (registration.strand_ == nullptr) {
      return InvalidArgument("StrandConsumer::TeardownQp: the registration is not registered");
    }
    std::shared_ptr<Strand> strand = registration.strand_;
    if (strand->core != core_) {
      return InvalidArgument("StrandConsumer::TeardownQp: qp_num " +
                             std::to_string(registration.qp_num()) +
                             " was registered through another StrandConsumer");
    }
    auto state = std::make_shared<internal::StrandTeardownState>();
    state->on_done = options.on_done;
    TeardownOptions forwarded = options;
    forwarded.on_done = [strand, state](const Status& status) {
      strand->PushTeardownEnd(state, status);
    };
    Result<Teardown> teardown = runtime_.TeardownQp(strand->registration, forwarded);
    if (!teardown.ok()) return teardown.status();
    registration.strand_ = nullptr;
    StrandTeardown out;
    out.state_ = std::move(state);
    return out;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("StrandConsumer::TeardownQp: out of memory");
  }
}

bool StrandConsumer::OnReadable() noexcept { return drainer_->OnReadable(core_->consumer); }

Status StrandConsumer::Stop() {
  if (Status refused = internal::RefuseWaitInCallback("StrandConsumer::Stop"); !refused.ok()) {
    return refused;
  }
  UnregisterHandedOver(*core_);
  return StopAndDeliver(runtime_, *core_, *drainer_);
}

StrandStats StrandConsumer::GetStats() const {
  StrandStats s;
  {
    internal::MutexLock lock(core_->mu);
    s.strands = core_->live.size();
  }
  s.strand_tasks = core_->strand_tasks.load(std::memory_order_relaxed);
  s.delivered = core_->delivered.load(std::memory_order_relaxed);
  s.orphans = core_->orphans.load(std::memory_order_relaxed);
  s.dropped_events = core_->dropped_events.load(std::memory_order_relaxed);
  s.enqueue_failures = core_->enqueue_failures.load(std::memory_order_relaxed);
  s.drain = drainer_->GetStats();
  return s;
}

}  // namespace cqd
