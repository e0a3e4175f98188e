// runtime/consumer.h: a consumer's queue and the dispatch of queued items to handlers.
//
// Producers (pollers, the event thread) each hold a moodycamel ProducerToken per consumer and
// hand over slices with one bulk enqueue. Depth is reserved before enqueue (TryReserve) and
// released after dequeue, so `depth` never undercounts and the queue never holds more than
// `queue_capacity` items from pollers: a full consumer makes pollers stall, never drop.
//
// Dispatch() runs on the consumer's thread only (the owned thread, or the engine thread calling
// Drain). It makes `batch_seq_` odd (seq_cst) before the batch's first handler call and even
// after its last, and reads each slot's state (seq_cst) right before calling its handler.
// Unregister stores the dead state (seq_cst), then reads `batch_seq_`: if odd, it waits until the
// value changes. Either the consumer's state read sees the registration gone, or Unregister sees
// the batch in progress and waits for it to end; one seq_cst store per batch, not per call.
#ifndef CQD_RUNTIME_CONSUMER_H_
#define CQD_RUNTIME_CONSUMER_H_

#include "concurrentqueue/concurrentqueue.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "cqd/handler.h"
#include "cqd/options.h"
#include "cqd/status.h"
#include "runtime/orphans.h"
#include "runtime/parker.h"
#include "runtime/registry.h"

namespace cqd::internal {

enum class ItemKind : uint32_t { kCompletion, kAsyncEvent };

// One queued completion or async event, tagged with the registration it was routed to.
struct Item {
  Item() : wc{} {}
  union {
    ibv_wc wc;
    AsyncEvent event;
  };
  uint32_t slot = 0;
  uint32_t generation = 0;
  ItemKind kind = ItemKind::kCompletion;
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
  moodycamel::ProducerToken MakeProducerToken() { return moodycamel::ProducerToken(queue_); }
  // Waits until a handler call this consumer may have started before the caller marked a slot
  // dead has returned, unless called from this consumer itself.
  void WaitForBatchInProgress() const noexcept;
  // Returns true on a thread that is running some consumer's handlers.
  static bool OnConsumerThread() noexcept;
  // Hands every queued completion to the orphan sink (destruction, no consumer left to run).
  void OrphanRemaining() noexcept;

  // Producers. TryReserve returns false when `n` more items would exceed the capacity (an empty
  // queue always accepts). Reserve always succeeds (shutdown flush, async events).
  bool TryReserve(size_t n) noexcept;
  void Reserve(size_t n) noexcept;
  // Enqueues `n` reserved items and wakes the consumer if it sleeps.
  void Push(moodycamel::ProducerToken& token, Item* items, size_t n) noexcept;

  // Consumer thread: dispatches up to `max` items; returns how many.
  int Dispatch(int max) noexcept;
  // Engine thread: Dispatch plus notify-fd upkeep (see Runtime::Drain).
  int Drain(int max) noexcept;
  int notify_fd() const { return notify_fd_; }

  uint32_t index() const { return index_; }
  ConsumerKind kind() const { return options_.kind; }
  const std::string& name() const { return options_.name; }
  uint64_t delivered() const { return delivered_.load(std::memory_order_relaxed); }
  uint64_t async_delivered() const { return async_delivered_.load(std::memory_order_relaxed); }
  uint64_t depth() const { return depth_.load(std::memory_order_relaxed); }
  uint64_t high_water() const { return high_water_.load(std::memory_order_relaxed); }

 private:
  void Run();
  void NoteDepth(uint64_t depth) noexcept;
  void DeliverRun(const Item* items, size_t n) noexcept;
  void DeliverEvent(const Item& item) noexcept;
  void Signal() noexcept;  // engine-driven: make the notify fd readable

  const uint32_t index_;
  const ConsumerOptions options_;
  const SlotPool& slots_;
  OrphanSink& orphans_;
  ItemQueue queue_;
  moodycamel::ConsumerToken consumer_token_;
  std::unique_ptr<Item[]> batch_;
  std::unique_ptr<ibv_wc[]> run_;
  int notify_fd_ = -1;
  // Engine thread only: the parker is prepared (a producer's Wake will write the notify fd), and
  // we wrote the fd ourselves.
  bool notify_armed_ = false;
  bool self_signaled_ = false;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Parker parker_;

  alignas(64) std::atomic<uint64_t> depth_{0};
  std::atomic<uint64_t> high_water_{0};
  alignas(64) std::atomic<uint64_t> batch_seq_{0};  // odd while a batch's handlers run
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> async_delivered_{0};
};

// Pins the calling thread to `cpu` (if >= 0) and names it; returns false if pinning failed.
bool PinAndNameThread(int cpu, const std::string& name);

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CONSUMER_H_
