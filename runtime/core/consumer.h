// runtime/core/consumer.h: a consumer's queue and the dispatch of queued items to handlers.
//
// Producers are the pollers only: each holds a moodycamel ProducerToken per consumer and hands
// over slices from its spill (spill.h) with bulk enqueues. Async events reach the consumer
// through the pollers of the QP's CQs too, so that one producer's FIFO order puts an event
// behind every completion that poller took off the QP's CQ before it. Depth is reserved before
// enqueue (ReserveUpTo) and released after dequeue, so `depth` never undercounts and the queue
// never holds more than `queue_capacity` items (Shutdown's final hand-over excepted): a full
// consumer makes pollers keep items in their spills, never drop them. A run-to-completion
// consumer's own poller skips the queue while it is empty: it dispatches straight from its
// spill (LoadBatch, DispatchLoaded), and queues only what the spill cannot hold. What it queued
// is older than what its spill holds, so the queue goes first and each QP's order stays.
//
// Dispatch() and DispatchLoaded() run on the consumer's thread only (the owned thread, the engine
// thread calling Drain, or for kRunToCompletion its poller's thread). Before a batch's first
// handler call they list the batch's slots in `batch_slots_` (release) and make `batch_seq_` odd
// (seq_cst); after the last call they make it even. Each reads each slot's state (seq_cst) right
// before calling its handler. Unregister stores the dead state (seq_cst), then reads
// `batch_seq_`: if odd and the batch lists the slot, it waits for the value to change. Either
// the consumer's state read sees the registration gone, or Unregister sees the batch that may
// call it and waits for its end. One seq_cst store per batch, not per call, and no wait on
// handlers of other QPs.
#ifndef CQD_RUNTIME_CORE_CONSUMER_H_
#define CQD_RUNTIME_CORE_CONSUMER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "concurrentqueue/concurrentqueue.h"
#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/status.h"
#include "runtime/base/parker.h"
#include "runtime/core/event_join.h"
#include "runtime/core/orphans.h"
#include "runtime/core/registry.h"
#include "runtime/observe/latency.h"

namespace cqd::internal {

// kAsyncEvent: a part of an EventJoin for a registration (async, fence or CM event).
// kTeardownMarker: a completion of a TeardownQp marker work request (teardown.h).
// kListenerEvent: a CM event for a channel's CmHandler (EventJoin kind kListener; slot kNoSlot).
enum class ItemKind : uint32_t { kCompletion, kAsyncEvent, kTeardownMarker, kListenerEvent };
inline constexpr uint32_t kNoSlot = ~uint32_t{0};

// One queued completion or async-event part, tagged with the registration it was routed to.
struct Item {
  Item() : wc{} {}
  union {
    ibv_wc wc;
    EventJoin* join;  // kAsyncEvent, kListenerEvent
  };
  uint32_t slot = 0;
  uint32_t generation = 0;
  ItemKind kind = ItemKind::kCompletion;
  uint32_t stamp = 0;  // completions: when polled, if latency is recorded (latency.h)
};
static_assert(sizeof(Item) == 64, "an Item is one cache line");

// What the consumer keeps of a dequeued Item besides its work completion. Dispatch dequeues
// through a SplitWriter: the completions land side by side in one ibv_wc array, so a run of one
// QP's completions reaches its handler as a span of that array, with no further copy.
struct ItemMeta {
  EventJoin* join;  // kAsyncEvent, kListenerEvent
  uint32_t slot;
  uint32_t generation;
  ItemKind kind;
  uint32_t stamp;
};

// An output iterator for moodycamel's dequeue_bulk that stores item k's wc in wcs[k] and the
// rest in meta[k].
class SplitWriter {
 public:
  SplitWriter(ibv_wc* wcs, ItemMeta* meta) noexcept : wcs_(wcs), meta_(meta) {}
  struct Ref {
    ibv_wc* wc;
    ItemMeta* meta;
    Ref& operator=(const Item& item) noexcept {
      if (item.kind == ItemKind::kAsyncEvent || item.kind == ItemKind::kListenerEvent) {
        meta->join = item.join;
      } else {
        *wc = item.wc;
      }
      meta->slot = item.slot;
      meta->generation = item.generation;
      meta->kind = item.kind;
      meta->stamp = item.stamp;
      return *this;
    }
  };
  Ref operator*() const noexcept { return {wcs_, meta_}; }
  SplitWriter& operator++() noexcept {
    ++wcs_;
    ++meta_;
    return *this;
  }
  SplitWriter operator++(int) noexcept {
    SplitWriter before = *this;
    ++*this;
    return before;
  }

 private:
  ibv_wc* wcs_;
  ItemMeta* meta_;
};

struct ItemQueueTraits : moodycamel::ConcurrentQueueDefaultTraits {
  static const size_t BLOCK_SIZE = 256;
  static const size_t EXPLICIT_INITIAL_INDEX_SIZE = 512;
};
using ItemQueue = moodycamel::ConcurrentQueue<Item, ItemQueueTraits>;

class Consumer {
 public:
  // `producers`: how many producer tokens will be made (sizes the preallocation).
  Consumer(uint32_t index, const ConsumerOptions& options, const SlotPool& slots,
           OrphanSink& orphans, int producers);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Control path.
  Status Start();  // kOwnedThread: starts the thread
  void Stop();     // kOwnedThread: dispatches what is queued, then joins the thread
  // kRunToCompletion, before any Push: producers wake `poller` (the parker of the poller whose
  // thread dispatches this consumer) instead of this consumer's own.
  void RunOnPoller(Parker* poller) { waker_ = poller; }
  // The dispatching thread, when it stops for good: closes the consumer (PushIfOpen refuses from
  // then on) and returns true if nothing is queued; else returns false (dispatch, then retry).
  bool CloseIfEmpty();
  moodycamel::ProducerToken MakeProducerToken() { return moodycamel::ProducerToken(queue_); }
  // Call after marking `slot` dead: waits until a handler call of it that this consumer may have
  // started has returned, unless this thread is running this consumer's handlers.
  void WaitForBatchInProgress(uint32_t slot) const noexcept;
  // The same without waiting: returns the batch that may still call `slot`'s handler (seq 0:
  // none, or this thread runs it); BatchOver(seq) says when it has ended.
  uint64_t BatchInProgress(uint32_t slot) const noexcept;
  bool BatchOver(uint64_t seq) const noexcept {
    return batch_seq_.load(std::memory_order_acquire) != seq;
  }
  // Engine-driven: the ThreadToken() (thread_role.h) of the thread that called Drain last.
  const std::atomic<uintptr_t>& last_drainer() const { return last_drainer_; }
  // Returns true if this thread is inside this consumer's Dispatch.
  bool DispatchingHere() const noexcept;
  // Returns true on a thread that is running some consumer's handlers.
  static bool OnConsumerThread() noexcept;
  // Hands every queued completion to the orphan sink (destruction, no consumer left to run).
  void OrphanRemaining() noexcept;
  // On a thread inside a dispatch batch: notes that `held` has events for the outermost batch
  // to run once it is over, and returns true; elsewhere returns false.
  static bool DeferHeldEvents(HeldEvents* held) noexcept;

  // Producers. ReserveUpTo reserves room for at most `n` items and returns how many (0 when the
  // queue holds queue_capacity items). Reserve always succeeds (Shutdown's final hand-over).
  size_t ReserveUpTo(size_t n) noexcept;
  void Reserve(size_t n) noexcept;
  // Enqueues `n` reserved items and wakes the consumer if it sleeps.
  void Push(moodycamel::ProducerToken& token, Item* items, size_t n) noexcept;
  // Reserve(1) and Push, unless the consumer has closed (an owned consumer whose thread exited
  // at Shutdown: nothing would dispatch it); returns false then. Callers serialize per token.
  bool PushIfOpen(moodycamel::ProducerToken& token, Item& item) noexcept;

  // Consumer thread: dispatches up to `max` items; returns how many.
  int Dispatch(int max) noexcept;
  // kRunToCompletion, its poller's thread, while nothing is queued (Pending() is false): the
  // poller dispatches items straight from its spill, skipping the queue. LoadBatch copies
  // items[0, n) (n <= dispatch_batch()) into the batch, so the caller may drop them from the
  // spill before any handler runs; DispatchLoaded(n) then dispatches them as Dispatch would.
  void LoadBatch(const Item* items, size_t n) noexcept;
  void DispatchLoaded(size_t n) noexcept;
  size_t dispatch_batch() const { return static_cast<size_t>(options_.dispatch_batch); }
  // Engine thread: Dispatch plus notify-fd upkeep (see Runtime::Drain).
  int Drain(int max) noexcept;
  int notify_fd() const { return notify_fd_; }

  uint32_t index() const { return index_; }
  // kOwnedThread: the thread, for placement (placement.h); 0 when there is none.
  pthread_t native_thread() { return thread_.joinable() ? thread_.native_handle() : 0; }
  ConsumerKind kind() const { return options_.kind; }
  const std::string& name() const { return options_.name; }
  uint64_t delivered() const { return delivered_.load(std::memory_order_relaxed); }
  // Async and CM events handed to QP handlers and CmHandlers.
  uint64_t async_delivered() const { return async_delivered_.load(std::memory_order_relaxed); }
  uint64_t depth() const { return depth_.load(std::memory_order_relaxed); }
  // Returns true if items are queued or reserved (seq_cst: a sleeper's re-check, parker.h).
  bool Pending() const noexcept { return depth_.load(std::memory_order_seq_cst) > 0; }
  uint64_t high_water() const { return high_water_.load(std::memory_order_relaxed); }
  // Null unless ConsumerOptions::record_latency.
  const LatencyHistogram* latency() const { return latency_.get(); }

 private:
  void Run();
  void NoteDepth(uint64_t depth) noexcept;
  // Delivers wcs_[first, first + n): one registration's completions.
  void DeliverRun(size_t first, size_t n) noexcept;
  void DeliverEvent(const ItemMeta& item) noexcept;
  void DeliverCm(EventJoin* join, const Slot& slot) noexcept;
  void DeliverListenerEvent(const ItemMeta& item) noexcept;
  void CountEvent() noexcept;
  void DeliverMarker(const ItemMeta& item, const ibv_wc& wc) noexcept;
  // Dequeues up to `max` items into wcs_ and meta_; returns how many.
  size_t DequeueBatch(size_t max) noexcept;
  // Runs the handlers of the `n` items in wcs_ and meta_.
  void RunBatch(size_t n) noexcept;
  void Signal() noexcept;  // engine-driven: make the notify fd readable

  const uint32_t index_;
  const ConsumerOptions options_;
  const SlotPool& slots_;
  OrphanSink& orphans_;
  ItemQueue queue_;
  moodycamel::ConsumerToken consumer_token_;
  // The batch being dispatched, split (SplitWriter).
  std::unique_ptr<ibv_wc[]> wcs_;
  std::unique_ptr<ItemMeta[]> meta_;
  // The slots of the batch being dispatched (consecutive duplicates once), for Unregister.
  std::unique_ptr<std::atomic<uint32_t>[]> batch_slots_;
  std::atomic<uint32_t> batch_slot_count_{0};
  int notify_fd_ = -1;
  // Engine thread only (see Drain): the parker is prepared, so a producer's Wake will write the
  // notify fd; a producer's write is owed and not yet read; we wrote the fd ourselves.
  bool notify_armed_ = false;
  bool wake_owed_ = false;
  bool self_signaled_ = false;
  std::atomic<uintptr_t> last_drainer_{0};  // written by Drain (relaxed), read by Teardown::Wait
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex close_mu_;  // orders PushIfOpen against the owned thread's exit
  bool closed_ = false;  // guarded by close_mu_
  Parker parker_;
  Parker* waker_ = &parker_;  // whom Push wakes: this consumer, or its run-to-completion poller
  const std::unique_ptr<LatencyHistogram> latency_ =
      options_.record_latency ? std::make_unique<LatencyHistogram>() : nullptr;

  alignas(64) std::atomic<uint64_t> depth_{0};
  std::atomic<uint64_t> high_water_{0};
  alignas(64) std::atomic<uint64_t> batch_seq_{0};  // odd while a batch's handlers run
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> async_delivered_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONSUMER_H_
