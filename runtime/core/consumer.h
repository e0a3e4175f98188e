// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/consumer.h: a consumer's queue and lanes, and the dispatch of their entries to
// handlers.
//
// Producers are the shards' drivers, and, once a shard has stopped, any thread that posts an event
// to it (the event thread, the teardown worker, a CM hand-on: the event is pushed as an Item under
// the inbox's mutex, EventInbox::Post). Each shard writes completions and async-event parts into
// its own lane of this consumer (lane.h) and hands them over by publishing the lane's position:
// the consumer reads each lane's published position itself, so nothing but that store and the
// depth reservation crosses cores per hand-over. One lane's FIFO order puts an event behind every
// completion that shard took off the QP's CQ before it. The few entries that travel alone
// (Items: Shutdown's hand-over, events posted after a shard stopped, the routing guard) go
// through a moodycamel queue, each naming the lane position it must follow. Depth counts the
// entries handed over and not yet dispatched: it is reserved before the hand-over (ReserveUpTo)
// and released after the entries' handlers have returned, so `depth` never undercounts and never
// exceeds `queue_capacity` (Shutdown's final hand-over excepted): a full consumer makes shards
// keep entries in their lanes' spills, never drop them. A run-to-completion consumer's own shard
// skips the hand-over while nothing is handed over: it dispatches straight from the spill of its
// lane (DispatchLane), and hands over only what the spill cannot hold. What it handed over is
// older than what its spill holds, so that goes first and each QP's order stays. With nothing
// handed over or spilled, the poller may run a poll's handlers as it routes them (the fused
// poll, shard/fused_poll.cc), in a batch of its own (OpenFusedBatch).
//
// Dispatch(), DispatchLane() and the fused batch run on the consumer's thread only (the owned
// thread, the engine thread calling Drain, or for kRunToCompletion its poller's thread).
//
// Unregister's guarantee (once it returns, no handler call of the registration is under way and
// none starts) rests on one word of the consumer's own, `calling_`. Before it calls a
// registration's handler (a run of completions, an async or CM event) or reads its teardown (a
// marker), the consumer stores the slot there (EnterCall: a release store, then LightFence, a
// compiler barrier), then reads the slot's state (acquire, RouteAtConsumer) and goes on only if
// it is live; a listener's event, the batch's end, and the OrphanHandler for a run found dead
// store "none" (LeaveCall). Unregister stores the dead
// state (seq_cst), runs HeavyFence (asymmetric_fence.h: every running thread of the process
// passes a full barrier), then reads `calling_` (CallInProgress): if it names the slot, it waits
// until the word names something else (CallOver, acquire: the call's effects happen before).
// Either the consumer's state read came after that barrier and sees the registration gone, or
// its store of the slot came before it and Unregister sees it. The hot path pays one plain store
// to its own line per handler call, no list per batch and no locked instruction; Unregister pays
// a system call that interrupts each CPU running a thread of the process. The wait lasts that
// registration's call, not the batch around it, and not at all on a thread running this consumer's
// handlers (runtime.h's threading rule says what is left for a handler to avoid).
#ifndef CQD_RUNTIME_CORE_CONSUMER_H_
#define CQD_RUNTIME_CORE_CONSUMER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "concurrentqueue/concurrentqueue.h"
#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/status.h"
#include "runtime/base/asymmetric_fence.h"
#include "runtime/base/mutex.h"
#include "runtime/base/parker.h"
#include "runtime/core/event_join.h"
#include "runtime/core/lane.h"
#include "runtime/core/orphans.h"
#include "runtime/core/registry.h"
#include "runtime/core/route.h"
#include "runtime/observe/latency.h"

namespace cqd::internal {

// One batch being dispatched on this thread, innermost first (tls_dispatch_frames in consumer.cc).
struct DispatchFrame {
  const class Consumer* consumer = nullptr;
  const DispatchFrame* outer = nullptr;
};

struct ItemQueueTraits : moodycamel::ConcurrentQueueDefaultTraits {
  static const size_t BLOCK_SIZE = 32;
  static const size_t EXPLICIT_INITIAL_INDEX_SIZE = 32;
};
using ItemQueue = moodycamel::ConcurrentQueue<Item, ItemQueueTraits>;

class Consumer {
 public:
  // `pollers`: how many shards produce (one lane and one producer token each).
  Consumer(uint32_t index, const ConsumerOptions& options, const SlotPool& slots,
           OrphanSink& orphans, int pollers);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Control path.
  Status Start();  // kOwnedThread: starts the thread
  void Stop();     // kOwnedThread: dispatches what is queued, then joins the thread
  // kRunToCompletion, before any Push: producers wake `poller` (the parker of the poller whose
  // thread dispatches this consumer) instead of this consumer's own.
  void RunOnPoller(Parker* poller) { waker_ = poller; }
  // Before any Push: the parker of shard `index`, which waits for room in its lane (back-pressure:
  // a batch that frees room wakes the shards whose lanes ask for it, Lane::wants_room).
  void SetProducerParker(int index, Parker* parker) { producer_parkers_[index] = parker; }
  // After a batch freed room: wakes the shards whose lanes asked for room.
  void WakeWaitingProducers() noexcept;
  // The dispatching thread, when it stops for good: closes the consumer (PushIfOpen refuses from
  // then on) and returns true if nothing is queued; else returns false (dispatch, then retry).
  bool CloseIfEmpty();
  moodycamel::ProducerToken MakeProducerToken() { return moodycamel::ProducerToken(queue_); }
  // Run-to-completion, on its poller's thread only: a batch whose completions the poller routes
  // as it runs them (the fused poll, FusedPoll::Poll). Between OpenFusedBatch and
  // CloseFusedBatch the poller calls EnterCall(slot), reads the slot's state, and DeliverFused
  // for a run it found live for this consumer.
  void OpenFusedBatch() noexcept;
  // Calls `slot`'s handler with `wcs`; the caller entered the call (EnterCall) and then read the
  // slot live for this consumer.
  static void DeliverFused(const Slot& slot, const ibv_wc* wcs, size_t n) noexcept {
    slot.handler.load(std::memory_order_relaxed)->OnCompletions({wcs, n});
  }
  // Ends the batch OpenFusedBatch began; `delivered` completions reached handlers in it.
  void CloseFusedBatch(uint64_t delivered) noexcept;
  // The dispatching thread, before it reads slot `slot`'s state to call its handler or note its
  // marker (see the header).
  void EnterCall(uint32_t slot) noexcept {
    calling_.store(slot + 1, std::memory_order_release);  // the previous call's effects first
    LightFence(expedited_);
  }
  // The dispatching thread, before it runs code that is not the entered registration's handler
  // (the OrphanHandler for a run found dead, CM events of another runtime): names no slot, so
  // that no Unregister waits for that code.
  void LeaveCall() noexcept { calling_.store(0, std::memory_order_release); }
  // Call after changing `slot`'s state (Unregister: dead; a failed TeardownQp: live again): waits
  // until a call of it that this consumer may have entered before the change has returned, unless
  // this thread is running this consumer's handlers (then that call may be on this very stack).
  void WaitForCallInProgress(uint32_t slot) const noexcept;
  // The same without waiting: returns the call that may still be under way (0: none, or this
  // thread runs this consumer's handlers); CallOver(call) says when it has returned.
  uint32_t CallInProgress(uint32_t slot) const noexcept;
  bool CallOver(uint32_t call) const noexcept {
    return calling_.load(std::memory_order_acquire) != call;
  }
  // Engine-driven: the ThreadToken() (thread_role.h) of the thread that called Drain last.
  const std::atomic<uintptr_t>& last_drainer() const { return engine_.last_drainer; }
  // Returns true while another thread's Drain is in progress (acquire; a snapshot).
  bool DrainingElsewhere() const noexcept {
    const uintptr_t drainer = engine_.draining.load(std::memory_order_acquire);
    return drainer != 0 && drainer != ThreadToken();
  }
  // Engine thread: records the calling thread as the one that drains (as Drain does).
  void NoteDrainer() noexcept {
    if (engine_.last_drainer.load(std::memory_order_relaxed) != ThreadToken()) {
      engine_.last_drainer.store(ThreadToken(), std::memory_order_relaxed);
    }
  }
  // Returns true if this thread is inside this consumer's Dispatch.
  bool DispatchingHere() const noexcept;
  // Returns true on a thread that is running some consumer's handlers.
  static bool OnConsumerThread() noexcept;
  // Hands every queued completion to the orphan sink (destruction, no consumer left to run).
  void OrphanRemaining() noexcept;
  // On a thread inside a dispatch batch: notes that `held` has events for the outermost batch
  // to run once it is over, and returns true; elsewhere returns false.
  static bool DeferHeldEvents(HeldEvents* held) noexcept;

  // Shard `poller`'s lane into this consumer.
  Lane& lane(int poller) noexcept { return *lanes_[poller]; }

  // Producers. ReserveUpTo reserves room for at most `n` entries and returns how many (0 when
  // queue_capacity entries are handed over). Reserve always succeeds (Shutdown's final hand-over).
  size_t ReserveUpTo(size_t n) noexcept;
  void Reserve(size_t n) noexcept;
  // After a lane's Publish of entries the caller reserved: wakes the consumer if it sleeps.
  void HandedOver() noexcept { waker_->Wake(); }
  // Event thread: a CQ whose QPs are all this consumer's got its event, and its poller is about
  // to be woken. An owned thread that sleeps wakes now, so that it spins (idle_spin) while the
  // poller wakes and hands the completions over, instead of sleeping until the hand-over wakes
  // it: the two wakes overlap. A hint: a wake with nothing to take costs one idle_spin of
  // spinning. Other kinds: nothing (an engine-driven consumer does not spin; a run-to-completion
  // one is its poller).
  void PreWake() noexcept {
    if (options_.kind != ConsumerKind::kOwnedThread || !parker_.Wake()) return;
    owned_.pre_wakes.store(owned_.pre_wakes.load(std::memory_order_relaxed) + 1,
                           std::memory_order_relaxed);  // the event thread alone writes it
  }
  // Returns how many of PreWake's calls woke the thread, asleep or about to sleep (pre_wakes).
  uint64_t pre_wakes() const { return owned_.pre_wakes.load(std::memory_order_relaxed); }
  // Queues `item` (its entry reserved by the caller; item.shard and item.after set) and wakes the
  // consumer if it sleeps. Callers serialize per token.
  void PushAlone(moodycamel::ProducerToken& token, Item& item) noexcept;
  // Reserve(1) and PushAlone, unless the consumer has closed (an owned consumer whose thread
  // exited at Shutdown: nothing would dispatch it); returns false then.
  bool PushIfOpen(moodycamel::ProducerToken& token, Item& item) noexcept;

  // Consumer thread: dispatches up to `max` entries; returns how many.
  int Dispatch(int max) noexcept;
  // kRunToCompletion, its poller's thread, while nothing is queued (Pending() is false): the
  // poller dispatches the entries [at, at + n) of its lane (n <= dispatch_batch(), no wrap),
  // which it has already taken out of the spill, in place, then releases them up to `end`.
  void DispatchLane(Lane& lane, uint32_t at, uint32_t n, uint64_t end) noexcept;
  size_t dispatch_batch() const { return static_cast<size_t>(options_.dispatch_batch); }
  // Engine thread: Dispatch plus notify-fd upkeep (see Runtime::Drain); -EBUSY at once while
  // another thread's Drain of this consumer is in progress.
  int Drain(int max) noexcept;
  int notify_fd() const { return engine_.fd; }

  uint32_t index() const { return index_; }
  // kOwnedThread: the thread, for placement (placement.h); 0 when there is none.
  pthread_t native_thread() { return owned_.thread.joinable() ? owned_.thread.native_handle() : 0; }
  ConsumerKind kind() const { return options_.kind; }
  const std::string& name() const { return options_.name; }
  uint64_t delivered() const { return delivered_.load(std::memory_order_relaxed); }
  // Async and CM events handed to QP handlers and CmHandlers.
  uint64_t async_delivered() const { return async_delivered_.load(std::memory_order_relaxed); }
  uint64_t depth() const { return depth_.load(std::memory_order_relaxed); }
  // Returns true if entries are queued, reserved or being dispatched by Dispatch (seq_cst: a
  // sleeper's re-check, parker.h). The hosted direct path (DispatchLane, from the spill, and a
  // fused batch) never counts its entries in depth_: Pending() is false while they run.
  bool Pending() const noexcept { return depth_.load(std::memory_order_seq_cst) > 0; }
  uint64_t high_water() const { return high_water_.load(std::memory_order_relaxed); }
  // Null unless ConsumerOptions::record_latency.
  const LatencyHistogram* latency() const { return latency_.get(); }

 private:
  void Run();
  void NoteDepth(uint64_t depth) noexcept;
  // A contiguous part of one batch: lane entries [at, at + n) ending before position `end`, or
  // one queued `item` (lane null).
  struct Piece {
    Lane* lane;
    const Item* item;
    uint32_t at;
    uint32_t n;
    uint64_t end;
  };
  int DrainHeld(int max) noexcept;  // Drain, by the thread that holds engine_.draining
  // Runs the handlers of pieces_[0, n).
  void RunBatch(size_t n) noexcept;
  // Outside every batch of this thread: runs the CM events a batch deferred (DeferHeldEvents).
  void DeliverHeldEvents() noexcept;
  void RunLane(Lane& lane, uint32_t at, uint32_t n) noexcept;
  // What PrefetchRun fetches for a run: its slot, or the handler its slot names.
  enum class PrefetchStage : uint8_t { kSlot, kHandler };
  // Prefetches the slot or the handler (`stage`) of the run at lane entry `i` (if a
  // completion's); returns the next run's entry (at most `end`).
  uint32_t PrefetchRun(Lane& lane, uint32_t i, uint32_t end, PrefetchStage stage) const noexcept;
  static constexpr int kSlotAhead = 8;     // runs between a slot's prefetch and its call
  static constexpr int kHandlerAhead = 4;  // runs between a handler's prefetch and its call
  // Returns true when handlers are worth prefetching: the runtime's slot pool has grown past one
  // chunk (SlotPool::kChunkSize, 4096 slots: more than about 4000 registrations at once; it never
  // shrinks). Below that the handlers' first lines stay in the consumer's cache and the handler
  // stage costs instructions without a miss to hide (docs/PERFORMANCE.md: 0.87x with 1000 QPs in
  // the fast mode).
  bool HandlersCold() const noexcept { return slots_.allocated() > SlotPool::kChunkSize; }
  void RunItem(const Item& item) noexcept;
  // Delivers one registration's run of completions.
  // Returns how many of the run's completions reached the handler (n, or 0: orphaned).
  size_t DeliverRun(const ibv_wc* wcs, size_t n, uint32_t slot, uint32_t generation) noexcept;
  void CountDelivered(uint64_t n) noexcept {  // adds to `delivered_` (this thread only)
    delivered_.store(delivered_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void DeliverEvent(EventJoin* join, uint32_t slot, uint32_t generation) noexcept;
  void DeliverCm(EventJoin* join, const Slot& slot) noexcept;
  void DeliverListenerEvent(EventJoin* join) noexcept;
  void CountEvent() noexcept;
  void DeliverMarker(uint32_t slot, uint32_t generation, const ibv_wc& wc) noexcept;
  // Carries out the no-consumer disposal of one entry: its completion `wc` or its event `join`.
  void Discard(EntryKind kind, const ibv_wc* wc, EventJoin* join) noexcept;
  // Adds lane `lane`'s entries handed over up to `handed`, and the items that follow them, up to
  // `budget` entries, to pieces_ from `pieces` on; returns how many entries. With `items_hidden`
  // (queued items not in alone_), it stops at the lane's last item in alone_: one still queued
  // may come next.
  uint32_t GatherLane(Lane& lane, uint64_t handed, uint32_t budget, size_t& pieces,
                      bool items_hidden) noexcept;
  // Moves queued items into alone_ while it has room.
  void TakeQueuedItems() noexcept;
  // Drops the items of alone_ that a batch has run.
  void ForgetRunItems() noexcept;
  // Hands what `n` entries of lane `l` from `at` hold to the orphan sink and releases events.
  void OrphanLane(Lane& lane, uint32_t at, uint32_t n) noexcept;
  void Signal() noexcept;  // engine-driven: make the notify fd readable

  const uint32_t index_;
  const ConsumerOptions options_;
  const SlotPool& slots_;
  OrphanSink& orphans_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // one per shard
  std::vector<Parker*> producer_parkers_;     // one per shard (SetProducerParker)
  ItemQueue queue_;  // Items only: lane entries are handed over by position
  moodycamel::ConsumerToken consumer_token_;
  // Items dequeued and not yet run, oldest first: items[0, count); `run[k]` once a batch has
  // taken items[k].
  struct AloneItems {
    std::unique_ptr<Item[]> items;
    std::unique_ptr<bool[]> run;
    size_t count = 0;
  };
  AloneItems alone_;
  std::unique_ptr<uint64_t[]> handed_;  // per lane: how far it was handed over, as a batch read it
  size_t next_lane_ = 0;                // the lane a batch looks at first (each gets its turn)
  std::unique_ptr<Piece[]> pieces_;     // the batch being dispatched
  // An engine-driven consumer's (see Drain): the notify fd; the engine thread's marks: the parker
  // is prepared, so a producer's Wake will write the fd; a producer's write is owed and not yet
  // read; we wrote the fd ourselves. And who drains: the Drain in progress (its ThreadToken, or
  // 0), the last one (relaxed, read by Teardown::Wait).
  struct EngineDrain {
    int fd = -1;
    bool armed = false;
    bool wake_owed = false;
    bool self_signaled = false;
    std::atomic<uintptr_t> last_drainer{0};
    std::atomic<uintptr_t> draining{0};
  };
  EngineDrain engine_;
  // A kOwnedThread consumer's thread; `close_mu` orders PushIfOpen against its exit.
  struct OwnedThread {
    std::thread thread;
    std::atomic<bool> stop{false};
    Mutex close_mu;
    bool closed CQD_GUARDED_BY(close_mu) = false;
    std::atomic<uint64_t> pre_wakes{0};  // PreWake's wakes (the event thread's)
  };
  OwnedThread owned_;
  Parker parker_;
  Parker* waker_ = &parker_;  // whom Push wakes: this consumer, or its run-to-completion poller
  const std::unique_ptr<LatencyHistogram> latency_ =
      options_.record_latency ? std::make_unique<LatencyHistogram>() : nullptr;

  alignas(64) std::atomic<uint64_t> depth_{0};
  std::atomic<uint64_t> high_water_{0};
  // Items pushed and not yet moved into alone_ (on depth_'s line, which Dispatch reads anyway).
  std::atomic<uint64_t> queued_items_{0};
  // The slot (plus one) whose handler call this consumer is entering or making; 0: none (see the
  // header). Written by the dispatching thread only.
  alignas(64) std::atomic<uint32_t> calling_{0};
  const bool expedited_ = AsymmetricFenceExpedited();  // LightFence's argument, read once
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> async_delivered_{0};
  // The fused batch's frame on this thread's list while it is open (last, so that the fields
  // above keep the lines they had before it).
  DispatchFrame fused_frame_{};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONSUMER_H_
