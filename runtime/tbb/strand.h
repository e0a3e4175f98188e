// SPDX-License-Identifier: BSD-2-Clause
// runtime/tbb/strand.h: a Strand, the internal QpHandler that StrandConsumer (cqd/tbb.h)
// registers in the engine's handler's place, and StrandCore, what a consumer's strands share.
//
// The drain task (one at a time per consumer: ArenaDrainer) calls a strand's handler functions;
// they queue each item and schedule a strand task, which delivers the queue to the user's handler,
// one task per strand at a time.
//
// A strand's queue is two Batches: `in_` (the drain task appends under the strand's spinlock) and
// `out_` (the strand task's own: it swaps it with `in_` under the lock, delivers it without the
// lock, and clears it, keeping its capacity). `scheduled` (a strand task is queued or running),
// `running` (a task is delivering `out_`) and `dead` change only under the lock; `running` and
// `dead` are atomics so that Unregister and the delivery loop may read them without it (acquire,
// written with release). The spinlock (acquire/release) orders the appends before the delivery
// and one strand task before the next.
#ifndef CQD_RUNTIME_TBB_STRAND_H_
#define CQD_RUNTIME_TBB_STRAND_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <unordered_set>
#include <vector>

#include "cqd/tbb.h"
#include "runtime/base/mutex.h"
#include "runtime/tbb/arena_drainer.h"

namespace cqd::internal {

class CQD_CAPABILITY("mutex") SpinLock {
 public:
  void Lock() noexcept CQD_ACQUIRE() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  void Unlock() noexcept CQD_RELEASE_CAPABILITY() {
    locked_.store(false, std::memory_order_release);
  }

 private:
  std::atomic<bool> locked_{false};
};

struct StrandTeardownState {
  Mutex mu;
  CondVar cv;
  bool finished CQD_GUARDED_BY(mu) = false;
  Status result CQD_GUARDED_BY(mu);
  std::atomic<bool> done{false};
  std::function<void(const Status&)> on_done;

  // Publishes the result, then calls on_done. Called once.
  void Finish(const Status& status) noexcept;
};

struct Strand;

struct StrandCore {
  Runtime* runtime = nullptr;
  ::tbb::task_arena* arena = nullptr;
  ConsumerId consumer = 0;
  int drain_budget = 256;
  int strand_budget = 64;
  OrphanHandler* orphan_handler = nullptr;

  Mutex stop_mu;  // serializes StrandConsumer::Stop
  Mutex mu;       // guards live, handed_over and the stopped transition
  std::unordered_set<Strand*> live CQD_GUARDED_BY(mu);  // strands registered or tearing down
  // Stored under mu; then each live strand's lock is taken and released (orders it with pushes).
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> inflight{0};  // strand tasks queued or running
  std::atomic<uint64_t> strand_tasks{0};
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> orphans{0};
  std::atomic<uint64_t> dropped_events{0};
  std::atomic<uint64_t> enqueue_failures{0};
  // Strands whose StrandRegistration went away on a poller or the event thread, where the
  // runtime cannot unregister: the next StrandConsumer call that may unregisters them.
  std::vector<std::shared_ptr<Strand>> handed_over CQD_GUARDED_BY(mu);
};

// What a strand holds: items in order, completions of adjacent runs merged.
struct StrandBatch {
  enum class Kind : uint8_t { kCompletions, kAsync, kCm, kTeardownEnd };
  struct Entry {
    Kind kind;
    uint32_t index;  // into wcs (first completion), events, cms or teardown_ends
    uint32_t count;  // completions
  };
  struct TeardownEnd {
    std::shared_ptr<StrandTeardownState> state;
    Status status;
  };

  std::vector<Entry> entries;
  std::vector<ibv_wc> wcs;
  std::vector<AsyncEvent> events;
  std::vector<CmEvent> cms;
  std::vector<TeardownEnd> teardown_ends;

  bool empty() const { return entries.empty(); }
  void clear();  // keeps the capacity: a strand's buffers grow to their high water, then stay
  void swap(StrandBatch& other) noexcept;
};

struct Strand final : public QpHandler, public std::enable_shared_from_this<Strand> {
  using Batch = StrandBatch;
  using Kind = StrandBatch::Kind;
  using Entry = StrandBatch::Entry;

  Strand(std::shared_ptr<StrandCore> c, QpHandler* u) : core(std::move(c)), user(u) {}
  ~Strand() override;

  // The runtime's side (the drain task): queue and schedule.
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override;
  void OnAsyncEvent(const AsyncEvent& event) noexcept override;
  void OnCmEvent(const CmEvent& event) noexcept override;

  // The runtime's teardown thread (on_done): the result goes behind everything queued.
  void PushTeardownEnd(const std::shared_ptr<StrandTeardownState>& state,
                       const Status& status) noexcept;

  // StrandRegistration::Unregister after the runtime registration ended: drops what is queued
  // and waits for a delivery in progress unless it runs on this thread.
  void Kill() noexcept;

  const std::shared_ptr<StrandCore> core;
  QpHandler* const user;
  Registration registration;  // the engine's thread (Register, Unregister, TeardownQp)

  SpinLock mu;

 private:
  // Appends with `append` under the lock and schedules a strand task; returns false when the
  // strand is dead or its consumer stopped: then what `append` adds is dropped (completions to the
  // orphan handler, counted) outside the lock, teardown_ends ignored (the caller finishes them).
  template <typename Append>
  bool Push(const Append& append) noexcept;
  void Enqueue() noexcept;
  void Run() noexcept;  // the strand task
  bool RequeueSelf() noexcept;
  // Delivers out_ in order until the strand dies; returns the items delivered.
  int Deliver() noexcept;
  // Gives up b's entries from `from` on: completions to the orphan handler (counted), events
  // counted; teardown_ends (only when `ends_too`) finish with kCancelled.
  void Drop(Batch& b, size_t from, bool ends_too) noexcept;
  // Takes the strand out of the consumer's live set (it is dead: Stop need not wait for it).
  void Leave() noexcept;

  Batch in_ CQD_GUARDED_BY(mu);
  bool scheduled CQD_GUARDED_BY(mu) = false;
  // The strand's own reference while `scheduled`, so that its queued task (which holds a plain
  // pointer) finds it alive; the task that clears `scheduled` drops it.
  std::shared_ptr<Strand> keep_alive CQD_GUARDED_BY(mu);
  std::atomic<bool> running{false};  // written under mu
  std::atomic<bool> dead{false};     // written under mu
  std::atomic<bool> lost{false};     // a completion was dropped
  Batch out_;                        // the strand task's
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_TBB_STRAND_H_
