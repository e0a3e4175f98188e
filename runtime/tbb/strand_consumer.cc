// SPDX-License-Identifier: BSD-2-Clause
// StrandConsumer (cqd/tbb.h): one engine-driven consumer drained by an ArenaDrainer, whose QPs
// are registered with a Strand (an internal QpHandler) that queues each item it is given and
// delivers the queue to the user's handler from a strand task, one task per strand at a time.
//
// A strand's queue is two Batches: `in_` (the drain task appends under the strand's spinlock) and
// `out_` (the strand task's own: it swaps it with `in_` under the lock, delivers it without the
// lock, and clears it, keeping its capacity). `scheduled` (a strand task is queued or running),
// `running` (a task is delivering `out_`) and `dead` change only under the lock; `running` and
// `dead` are atomics so that Unregister and the delivery loop may read them without it (acquire,
// written with release). The spinlock (acquire/release) orders the appends before the delivery
// and one strand task before the next.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cqd/tbb.h"
#include "runtime/tbb/arena_drainer.h"

namespace cqd {
namespace internal {
namespace {

class SpinLock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

enum class Kind : uint8_t { kCompletions, kAsync, kCm, kFence };

struct Entry {
  Kind kind;
  uint32_t index;  // into wcs (first completion), events, cms or fences
  uint32_t count;  // completions
};

}  // namespace

struct StrandTeardownState {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;  // under mu
  Status result;          // under mu
  std::atomic<bool> done{false};
  std::function<void(const Status&)> on_done;

  // Publishes the result, then calls on_done. Called once.
  void Finish(const Status& status) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu);
      result = status;
      finished = true;
    }
    done.store(true, std::memory_order_release);
    cv.notify_all();
    if (on_done) {
      try {
        on_done(status);
      } catch (...) {  // an on_done that throws: the result is already published
      }
    }
  }
};

struct StrandCore {
  Runtime* runtime = nullptr;
  ::tbb::task_arena* arena = nullptr;
  ConsumerId consumer = 0;
  int drain_budget = 256;
  int strand_budget = 64;
  OrphanHandler* orphan_handler = nullptr;

  std::mutex stop_mu;                // serializes StrandConsumer::Stop
  std::mutex mu;                     // guards live and the stopped transition
  std::unordered_set<Strand*> live;  // strands registered or tearing down
  std::atomic<bool> stopped{false};  // written under mu and each live strand's lock
  std::atomic<int64_t> inflight{0};  // strand tasks queued or running
  std::atomic<uint64_t> strand_tasks{0};
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> orphans{0};
  std::atomic<uint64_t> dropped_events{0};
  std::atomic<uint64_t> enqueue_failures{0};
  // Strands whose StrandRegistration went away on a poller or the event thread, where the
  // runtime cannot unregister: the next StrandConsumer call that may unregisters them. Under mu.
  std::vector<std::shared_ptr<Strand>> handed_over;
};

namespace {

struct Fence {
  std::shared_ptr<StrandTeardownState> state;
  Status status;
};

// What a strand holds: items in order, completions of adjacent runs merged.
struct Batch {
  std::vector<Entry> entries;
  std::vector<ibv_wc> wcs;
  std::vector<AsyncEvent> events;
  std::vector<CmEvent> cms;
  std::vector<Fence> fences;

  bool empty() const { return entries.empty(); }
  void clear() {  // keeps the capacity: a strand's buffers grow to their high water, then stay
    entries.clear();
    wcs.clear();
    events.clear();
    cms.clear();
    fences.clear();
  }
  void swap(Batch& other) noexcept {
    entries.swap(other.entries);
    wcs.swap(other.wcs);
    events.swap(other.events);
    cms.swap(other.cms);
    fences.swap(other.fences);
  }
};

}  // namespace

struct Strand final : public QpHandler, public std::enable_shared_from_this<Strand> {
  Strand(std::shared_ptr<StrandCore> c, QpHandler* u) : core(std::move(c)), user(u) {}
  ~Strand() override {
    std::lock_guard<std::mutex> lock(core->mu);
    core->live.erase(this);
  }

  // The runtime's side (the drain task): queue and schedule.
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    Push([&](Batch& b) {
      const auto first = static_cast<uint32_t>(b.wcs.size());
      const auto count = static_cast<uint32_t>(wcs.size());
      b.wcs.insert(b.wcs.end(), wcs.begin(), wcs.end());
      if (!b.entries.empty() && b.entries.back().kind == Kind::kCompletions &&
          b.entries.back().index + b.entries.back().count == first) {
        b.entries.back().count += count;  // adjacent runs: one call to the user handler
      } else {
        b.entries.push_back({Kind::kCompletions, first, count});
      }
    });
  }
  void OnAsyncEvent(const AsyncEvent& event) noexcept override {
    Push([&](Batch& b) {
      b.events.push_back(event);
      b.entries.push_back({Kind::kAsync, static_cast<uint32_t>(b.events.size() - 1), 0});
    });
  }
  void OnCmEvent(const CmEvent& event) noexcept override {
    Push([&](Batch& b) {
      b.cms.push_back(event);
      b.entries.push_back({Kind::kCm, static_cast<uint32_t>(b.cms.size() - 1), 0});
    });
  }

  // The runtime's teardown thread (on_done): the result goes behind everything queued.
  void PushFence(const std::shared_ptr<StrandTeardownState>& state, const Status& status) noexcept {
    bool finish_now = false;
    Status result = status;
    {
      std::lock_guard<SpinLock> lock(mu);
      if (!scheduled && in_.empty() && !dead.load(std::memory_order_relaxed) &&
          !core->stopped.load(std::memory_order_acquire)) {
        dead.store(true, std::memory_order_release);  // delivered up to here: nothing follows
        finish_now = true;
      }
    }
    if (!finish_now) {
      if (Push([&](Batch& b) {
            b.fences.push_back({state, status});
            b.entries.push_back({Kind::kFence, static_cast<uint32_t>(b.fences.size() - 1), 0});
          })) {
        return;
      }
      // Dead or stopped: nothing more is delivered. OK only if nothing was dropped.
      if (result.ok() && lost.load(std::memory_order_acquire)) {
        result =
            Cancelled("StrandConsumer: the strand dropped completions before the teardown's end");
      }
    }
    Leave();
    state->Finish(result);
  }

  // Appends with `append` under the lock and schedules a strand task; returns false when the
  // strand is dead or its consumer stopped: then what `append` adds is dropped (completions to the
  // orphan handler, counted) outside the lock, fences ignored (the caller finishes them).
  template <typename Append>
  bool Push(const Append& append) noexcept {
    bool schedule = false;
    bool rejected = false;
    {
      std::lock_guard<SpinLock> lock(mu);
      if (!dead.load(std::memory_order_relaxed) && !core->stopped.load(std::memory_order_acquire)) {
        try {
          append(in_);
        } catch (const std::bad_alloc&) {  // dropped and counted: memory ran out
          lost.store(true, std::memory_order_release);
          core->orphans.fetch_add(1, std::memory_order_relaxed);
          return true;
        }
        if (!scheduled) {
          scheduled = true;
          schedule = true;
          keep_alive = shared_from_this();  // the registration holds one: this cannot throw
          core->inflight.fetch_add(1, std::memory_order_seq_cst);
        }
      } else {
        rejected = true;
      }
    }
    if (rejected) {
      Batch dropped;
      try {
        append(dropped);
      } catch (const std::bad_alloc&) {
      }
      Drop(dropped, 0, /*fences_too=*/false);
      return false;
    }
    if (schedule) Enqueue();
    return true;
  }

  void Enqueue() noexcept {
    if (EnqueueTask(*core->arena, [s = this] { s->Run(); })) return;
    core->enqueue_failures.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<Strand> last;
    {
      std::lock_guard<SpinLock> lock(mu);
      scheduled = false;  // the next push retries
      last = std::move(keep_alive);
    }
    core->inflight.fetch_sub(1, std::memory_order_release);
  }

  // The strand task.
  void Run() noexcept {
    bool requeued = false;
    std::shared_ptr<Strand> last;  // released after the inflight decrement
    {
      TaskScope scope(core.get(), this);
      core->strand_tasks.fetch_add(1, std::memory_order_relaxed);
      int items = 0;
      for (;;) {
        bool yield = false;
        {
          std::lock_guard<SpinLock> lock(mu);
          if (in_.empty() || dead.load(std::memory_order_relaxed)) {
            scheduled = false;
            last = std::move(keep_alive);
            break;
          }
          if (items >= core->strand_budget) {
            yield = true;  // behind the arena's other tasks; `scheduled` stays set
          } else {
            out_.swap(in_);
            running.store(true, std::memory_order_release);
          }
        }
        if (yield) {
          if (RequeueSelf()) {
            requeued = true;  // the new task takes over this one's inflight count
            break;
          }
          items = 0;
          continue;
        }
        items += Deliver();
        out_.clear();
        std::lock_guard<SpinLock> lock(mu);
        running.store(false, std::memory_order_release);
      }
    }
    if (!requeued) core->inflight.fetch_sub(1, std::memory_order_release);
  }

  bool RequeueSelf() noexcept {
    return EnqueueTask(*core->arena, [s = this] { s->Run(); });
  }

  // Delivers out_ in order until the strand dies; returns the items delivered.
  int Deliver() noexcept {
    int n = 0;
    const size_t size = out_.entries.size();
    for (size_t i = 0; i < size; ++i) {
      if (dead.load(std::memory_order_acquire)) {
        Drop(out_, i, /*fences_too=*/true);
        return n;
      }
      const Entry& e = out_.entries[i];
      switch (e.kind) {
        case Kind::kCompletions:
          user->OnCompletions(std::span<const ibv_wc>(out_.wcs.data() + e.index, e.count));
          core->delivered.fetch_add(e.count, std::memory_order_relaxed);
          break;
        case Kind::kAsync:
          user->OnAsyncEvent(out_.events[e.index]);
          core->delivered.fetch_add(1, std::memory_order_relaxed);
          break;
        case Kind::kCm:
          user->OnCmEvent(out_.cms[e.index]);
          core->delivered.fetch_add(1, std::memory_order_relaxed);
          break;
        case Kind::kFence: {
          // The runtime unregistered the QP before this: nothing follows. The handler made its
          // last call; the result goes out now.
          {
            std::lock_guard<SpinLock> lock(mu);
            dead.store(true, std::memory_order_release);
          }
          Leave();
          out_.fences[e.index].state->Finish(out_.fences[e.index].status);
          break;
        }
      }
      ++n;
    }
    return n;
  }

  // Gives up b's entries from `from` on: completions to the orphan handler (counted), events
  // counted; fences (only when `fences_too`) finish with kCancelled.
  void Drop(Batch& b, size_t from, bool fences_too) noexcept {
    for (size_t i = from; i < b.entries.size(); ++i) {
      const Entry& e = b.entries[i];
      if (e.kind == Kind::kCompletions) {
        lost.store(true, std::memory_order_release);
        core->orphans.fetch_add(e.count, std::memory_order_relaxed);
        if (core->orphan_handler != nullptr) {
          core->orphan_handler->OnOrphans(std::span<const ibv_wc>(b.wcs.data() + e.index, e.count));
        }
      } else if (e.kind == Kind::kFence) {
        if (fences_too) {
          Leave();
          b.fences[e.index].state->Finish(
              Cancelled("StrandConsumer: the strand was unregistered before the teardown's end"));
        }
      } else {
        core->dropped_events.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  // Takes the strand out of the consumer's live set (it is dead: Stop need not wait for it).
  void Leave() noexcept {
    std::lock_guard<std::mutex> lock(core->mu);
    core->live.erase(this);
  }

  // StrandRegistration::Unregister after the runtime registration ended.
  void Kill() noexcept {
    Batch leftovers;
    bool wait = false;
    {
      std::lock_guard<SpinLock> lock(mu);
      dead.store(true, std::memory_order_release);
      leftovers.swap(in_);
      wait = running.load(std::memory_order_relaxed) && !TaskScope::InStrand(this);
    }
    Drop(leftovers, 0, /*fences_too=*/true);
    Leave();
    if (!wait) return;
    for (int spins = 0; running.load(std::memory_order_acquire); ++spins) {
      if (spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  const std::shared_ptr<StrandCore> core;
  QpHandler* const user;
  Registration registration;  // the engine's thread (Register, Unregister, TeardownQp)

  SpinLock mu;
  Batch in_;               // under mu
  bool scheduled = false;  // under mu
  // Under mu: the strand's own reference while `scheduled`, so that its queued task (which holds a
  // plain pointer) finds it alive; the task that clears `scheduled` drops it.
  std::shared_ptr<Strand> keep_alive;
  std::atomic<bool> running{false};  // written under mu
  std::atomic<bool> dead{false};     // written under mu
  std::atomic<bool> lost{false};     // a completion was dropped
  Batch out_;                        // the strand task's
};

}  // namespace internal

using internal::Strand;
using internal::StrandCore;
using internal::TaskScope;

namespace {

// Unregisters the strands handed over by StrandRegistration::HandOver, where this thread may.
void UnregisterHandedOver(StrandCore& core) noexcept {
  std::vector<std::shared_ptr<Strand>> strands;
  {
    std::lock_guard<std::mutex> lock(core.mu);
    if (core.handed_over.empty()) return;
    strands.swap(core.handed_over);
  }
  for (std::shared_ptr<Strand>& strand : strands) {
    strand->registration.Unregister();
    if (!strand->registration.registered()) {
      strand->Kill();
      continue;
    }
    std::lock_guard<std::mutex> lock(core.mu);  // a poller or the event thread again: later
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
  std::lock_guard<std::mutex> lock(core.mu);
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
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->finished) return state_->result;  // any thread
  }
  if (Status refused = internal::RefuseWaitInCallback("StrandTeardown::Wait"); !refused.ok()) {
    return FailedPrecondition(refused.message() + ": use TeardownOptions::on_done");
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->finished; });
  return state_->result;
}

namespace {

// StrandConsumer::Stop past its refusal (the destructor's too).
Status StopAndDeliver(Runtime& runtime, StrandCore& core, internal::ArenaDrainer& drainer) {
  std::lock_guard<std::mutex> stop_lock(core.stop_mu);
  if (Status s = drainer.Stop(); !s.ok()) return s;
  if (core.stopped.load(std::memory_order_acquire)) return Status::Ok();
  // What the consumer still holds goes to the strands, on this thread: no drain task runs now.
  while (runtime.Drain(core.consumer, core.drain_budget) > 0) {
  }
  internal::WaitForZero(core.inflight);
  {
    // From here a push finds `stopped` (the lock of each live strand orders it with the pushes
    // that did not), so no strand task starts after the wait below.
    std::lock_guard<std::mutex> lock(core.mu);
    core.stopped.store(true, std::memory_order_release);
    for (Strand* strand : core.live) {
      std::lock_guard<internal::SpinLock> strand_lock(strand->mu);
    }
  }
  internal::WaitForZero(core.inflight);
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
    auto drainer =
        internal::ArenaDrainer::Create(runtime, arena, {options.consumer}, options.watcher_thread,
                                       options.drain_budget, "StrandConsumer::Create");
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
      std::lock_guard<std::mutex> lock(core_->mu);
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
    forwarded.on_done = [strand, state](const Status& status) { strand->PushFence(state, status); };
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
    std::lock_guard<std::mutex> lock(core_->mu);
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
