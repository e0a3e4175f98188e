// SPDX-License-Identifier: BSD-2-Clause
// Consumer (consumer.h): the hot path. Producers' reservations and pushes, the batch gathered from
// the lanes' published entries and the queued items, and its delivery to handlers.
// consumer_drive.cc runs it; consumer_events.cc delivers the events and markers a batch holds.
#include "runtime/core/consumer.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cstring>

#include "runtime/base/chaos.h"
#include "runtime/base/check.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/teardown.h"

namespace cqd::internal {
namespace {

// The consumers whose Dispatch is running on this thread, innermost first (a handler of one
// engine-driven consumer may Drain another).
thread_local const DispatchFrame* tls_dispatch_frames = nullptr;
// CM events handed on to a closed consumer's CmHandler on this thread inside a batch: the
// outermost batch runs them once it is over (cm_router.h).
thread_local HeldEvents* tls_held_to_run = nullptr;

bool DispatchingOnThisThread(const Consumer* consumer) {
  for (const DispatchFrame* f = tls_dispatch_frames; f != nullptr; f = f->outer) {
    if (f->consumer == consumer) return true;
  }
  return false;
}

}  // namespace

Consumer::Consumer(uint32_t index, const ConsumerOptions& options, const SlotPool& slots,
                   OrphanSink& orphans, int pollers)
    : index_(index),
      options_(options),
      slots_(slots),
      orphans_(orphans),
      // Items are rare (lane.h): two blocks per producer (the pollers, and the event thread after
      // Shutdown); past that, pushes allocate.
      queue_(2 * ItemQueueTraits::BLOCK_SIZE * (pollers + 2)),
      consumer_token_(queue_),
      alone_{std::make_unique<Item[]>(options.dispatch_batch),
             std::make_unique<bool[]>(options.dispatch_batch)},
      handed_(std::make_unique<uint64_t[]>(static_cast<size_t>(pollers))),
      pieces_(std::make_unique<Piece[]>(options.dispatch_batch)) {
  for (int p = 0; p < pollers; ++p) {
    lanes_.push_back(std::make_unique<Lane>(static_cast<uint32_t>(p),
                                            static_cast<uint32_t>(options.spill_capacity),
                                            options.queue_capacity));
  }
  producer_parkers_.assign(static_cast<size_t>(pollers), nullptr);
  if (options_.kind == ConsumerKind::kEngineDriven) {
    engine_.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    parker_.UseEventFd(engine_.fd);
    // Start "asleep": the first Push makes the fd readable, before any Drain call.
    parker_.Prepare();
    engine_.armed = true;
  }
}

Consumer::~Consumer() {
  Stop();
  if (engine_.fd >= 0) close(engine_.fd);
}

size_t Consumer::ReserveUpTo(size_t n) noexcept {
  const uint64_t capacity = options_.queue_capacity;
  uint64_t depth = depth_.load(std::memory_order_relaxed);
  uint64_t take;
  do {
    if (depth >= capacity) return 0;
    take = std::min<uint64_t>(n, capacity - depth);
  } while (!depth_.compare_exchange_weak(depth, depth + take, std::memory_order_seq_cst,
                                         std::memory_order_relaxed));
  NoteDepth(depth + take);
  return take;
}

void Consumer::Reserve(size_t n) noexcept {
  NoteDepth(depth_.fetch_add(n, std::memory_order_seq_cst) + n);
}

void Consumer::NoteDepth(uint64_t depth) noexcept {
  uint64_t high = high_water_.load(std::memory_order_relaxed);
  while (depth > high &&
         !high_water_.compare_exchange_weak(high, depth, std::memory_order_relaxed)) {
  }
}

void Consumer::PushAlone(moodycamel::ProducerToken& token, Item& item) noexcept {
  queued_items_.fetch_add(1, std::memory_order_relaxed);
  // try_enqueue never allocates; past the preallocation (many producers, or Shutdown handing
  // over many events) fall back to the allocating path rather than drop.
  if (!queue_.try_enqueue(token, item)) {
    while (!queue_.enqueue(token, item)) std::this_thread::yield();  // out of memory
  }
  waker_->Wake();
}

bool Consumer::PushIfOpen(moodycamel::ProducerToken& token, Item& item) noexcept {
  MutexLock lock(owned_.close_mu);
  if (owned_.closed) return false;
  Reserve(1);
  PushAlone(token, item);
  return true;
}

void Consumer::TakeQueuedItems() noexcept {
  const size_t room = static_cast<size_t>(options_.dispatch_batch) - alone_.count;
  if (room == 0 || queued_items_.load(std::memory_order_relaxed) == 0) return;
  // One producer's items come out in its order (moodycamel), so each lane's stay in order.
  const size_t n = queue_.try_dequeue_bulk(consumer_token_, &alone_.items[alone_.count], room);
  for (size_t k = alone_.count; k < alone_.count + n; ++k) alone_.run[k] = false;
  alone_.count += n;
  queued_items_.fetch_sub(n, std::memory_order_relaxed);
}

void Consumer::ForgetRunItems() noexcept {
  size_t kept = 0;
  for (size_t k = 0; k < alone_.count; ++k) {
    if (alone_.run[k]) continue;
    if (kept != k) alone_.items[kept] = alone_.items[k];
    alone_.run[kept++] = false;
  }
  alone_.count = kept;
}

uint32_t Consumer::GatherLane(Lane& lane, uint64_t handed, uint32_t budget, size_t& pieces,
                              bool items_hidden) noexcept {
  uint64_t from = lane.recycled();  // after `handed` was read (Lane::TryRewind)
  // The oldest item of this lane not yet taken: the lane is read up to its position, then it.
  size_t next_item = 0;
  auto find_item = [&]() -> Item* {
    for (; next_item < alone_.count; ++next_item) {
      if (!alone_.run[next_item] && alone_.items[next_item].shard == lane.index()) {
        return &alone_.items[next_item];
      }
    }
    return nullptr;
  };
  Item* item = find_item();
  uint32_t got = 0;
  while (got < budget) {
    if (item != nullptr && from >= item->after) {
      pieces_[pieces++] = {nullptr, item, 0, 1, 0};
      alone_.run[next_item] = true;
      ++got;
      item = find_item();
      continue;
    }
    if (item == nullptr && items_hidden) break;
    const uint64_t limit = item != nullptr ? std::min(handed, item->after) : handed;
    if (from >= limit) break;
    const uint32_t at = lane.IndexOf(from);
    const uint32_t n =
        static_cast<uint32_t>(std::min<uint64_t>({limit - from, budget - got, lane.size() - at}));
    pieces_[pieces++] = {&lane, nullptr, at, n, from + n};
    got += n;
    from += n;
  }
  return got;
}

int Consumer::Dispatch(int max) noexcept {
  // An idle consumer spins here, on the one line producers write once per hand-over.
  if (depth_.load(std::memory_order_relaxed) == 0) return 0;
  // The next entries' lines start crossing now, beside the published positions read below.
  for (const auto& lane : lanes_) lane->PrefetchNext();
  // The lanes' positions first, then the queue: an item queued before a hand-over this batch sees
  // (its producer pushed it, then published more) is in the queue by then, so no lane is read
  // past an item still queued. Items that do not fit in alone_ stay queued: items_hidden.
  const size_t lanes = lanes_.size();
  for (size_t l = 0; l < lanes; ++l) handed_[l] = lanes_[l]->HandedUpTo();
  TakeQueuedItems();
  const bool items_hidden = queued_items_.load(std::memory_order_relaxed) > 0;
  const uint32_t want = static_cast<uint32_t>(std::clamp(max, 0, options_.dispatch_batch));
  // Gather up to `want` entries, lane by lane, each lane's ranges split where the ring wraps.
  uint32_t entries = 0;
  size_t pieces = 0;
  for (size_t k = 0; k < lanes && entries < want; ++k) {
    size_t l = next_lane_ + k;
    if (l >= lanes) l -= lanes;
    entries += GatherLane(*lanes_[l], handed_[l], want - entries, pieces, items_hidden);
  }
  if (++next_lane_ == lanes) next_lane_ = 0;
  if (entries == 0) return 0;
  RunBatch(pieces);
  ChaosPoint();  // the handlers returned, nothing released yet
  // The handlers have returned: the lane memory may be reused, and the entries leave the depth.
  for (size_t k = 0; k < pieces; ++k) {
    if (pieces_[k].lane != nullptr) pieces_[k].lane->Recycle(pieces_[k].end);
  }
  if (alone_.count > 0) ForgetRunItems();
  ChaosPoint();  // the lanes released, the depth not yet
  // seq_cst: the room is freed before wants_room is read (lane.h), so a poller going to sleep for
  // want of room either sees it or is woken.
  depth_.fetch_sub(entries, std::memory_order_seq_cst);
  WakeWaitingProducers();
  DeliverHeldEvents();
  return static_cast<int>(entries);
}

void Consumer::WakeWaitingProducers() noexcept {
  for (size_t p = 0; p < lanes_.size(); ++p) {
    std::atomic<bool>& wants = lanes_[p]->wants_room;
    if (!wants.load(std::memory_order_seq_cst)) continue;  // one load of a line we write anyway
    if (wants.exchange(false, std::memory_order_acq_rel) && producer_parkers_[p] != nullptr) {
      producer_parkers_[p]->Wake();
    }
  }
}

void Consumer::DispatchLane(Lane& lane, uint32_t at, uint32_t n, uint64_t end) noexcept {
  pieces_[0] = {&lane, nullptr, at, n, end};
  RunBatch(1);
  lane.Recycle(end);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the room freed, then wants_room read
  WakeWaitingProducers();
  DeliverHeldEvents();
}

void Consumer::RunBatch(size_t pieces) noexcept {
  if (latency_ != nullptr) [[unlikely]] {
    const uint32_t now = NowNs32();  // one clock read per batch, whatever its pieces
    for (size_t k = 0; k < pieces; ++k) {
      const Piece& piece = pieces_[k];
      if (piece.lane != nullptr) {
        latency_->RecordBatch(&piece.lane->meta(piece.at), piece.n, EntryKind::kCompletion, now);
      } else {
        latency_->RecordBatch(piece.item, 1, EntryKind::kCompletion, now);
      }
    }
  }
  CQD_DCHECK(!DispatchingOnThisThread(this), "a consumer's batch opened inside one of its own");
  const DispatchFrame frame{this, tls_dispatch_frames};
  tls_dispatch_frames = &frame;
  for (size_t k = 0; k < pieces; ++k) {
    const Piece& piece = pieces_[k];
    if (piece.lane != nullptr) {
      RunLane(*piece.lane, piece.at, piece.n);
    } else {
      RunItem(*piece.item);
    }
  }
  calling_.store(0, std::memory_order_release);  // between batches (the last call's effects first)
  tls_dispatch_frames = frame.outer;
}

void Consumer::OpenFusedBatch() noexcept {
  CQD_DCHECK(!DispatchingOnThisThread(this), "a consumer's fused batch opened inside its own");
  fused_frame_ = {this, tls_dispatch_frames};
  tls_dispatch_frames = &fused_frame_;
}

void Consumer::CloseFusedBatch(uint64_t delivered) noexcept {
  calling_.store(0, std::memory_order_release);  // as at a batch's end
  tls_dispatch_frames = fused_frame_.outer;
  CountDelivered(delivered);
  DeliverHeldEvents();
}

void Consumer::DeliverHeldEvents() noexcept {
  if (tls_held_to_run != nullptr && tls_dispatch_frames == nullptr) [[unlikely]] {
    // CM events handed on to a closed consumer's CmHandler during the batch: after it (and any
    // batch around it), so that no Unregister or teardown waits for them; and after its entries
    // were released, so that a CmHandler that calls Drain does not find them again.
    HeldEvents* held = tls_held_to_run;
    tls_held_to_run = nullptr;
    held->DeliverAll();
  }
}

uint32_t Consumer::PrefetchRun(Lane& lane, uint32_t i, uint32_t end,
                               PrefetchStage stage) const noexcept {
  const EntryMeta& meta = lane.meta(i);
  if (meta.kind != EntryKind::kCompletion) return i + 1;
  const Slot& slot = slots_.slot(meta.slot);
  if (stage == PrefetchStage::kSlot) {
    __builtin_prefetch(&slot);
  } else {
    // The slot came in kSlotAhead - kHandlerAhead runs ago. The pointer may be stale (the run may
    // be an orphan by the time it is delivered): a prefetch neither faults nor needs the object
    // to be alive, and DeliverRun reads the pointer again after its state check.
    __builtin_prefetch(slot.handler.load(std::memory_order_relaxed));
  }
  // A branch, not arithmetic on the run's length: with short runs (many QPs) it is predicted and
  // the next entry's load starts without waiting for this one's.
  if (meta.run > 1) [[unlikely]]
    return i + std::min<uint32_t>(meta.run, end - i);
  return i + 1;
}

void Consumer::RunLane(Lane& lane, uint32_t at, uint32_t n) noexcept {
  const uint32_t end = at + n;
  // DeliverRun reads each run's slot, then calls the handler the slot names (its first line holds
  // the vtable pointer). With many QPs both are misses: fetch the slots kSlotAhead runs ahead of
  // the call and the handlers kHandlerAhead runs ahead (by then their slots have come), so that
  // the misses overlap instead of each coming after the previous handler call. The handler stage
  // runs only while HandlersCold(); otherwise its cursor starts at the end.
  uint32_t slot_ahead = at;
  for (int k = 0; k < kSlotAhead && slot_ahead < end; ++k)
    slot_ahead = PrefetchRun(lane, slot_ahead, end, PrefetchStage::kSlot);
  uint32_t handler_ahead = HandlersCold() ? at : end;
  for (int k = 0; k < kHandlerAhead && handler_ahead < end; ++k)
    handler_ahead = PrefetchRun(lane, handler_ahead, end, PrefetchStage::kHandler);
  uint32_t i = at;
  uint64_t delivered = 0;  // counted once for the piece, not once per run
  while (i < end) {
    const EntryMeta& first = lane.meta(i);
    if (first.kind == EntryKind::kCompletion) [[likely]] {
      uint32_t len = std::min<uint32_t>(first.run, end - i);
      // Runs of one registration that follow each other (routed by different polls, or one
      // entry at a time by the general path) reach the handler as one span.
      while (i + len < end) {
        const EntryMeta& next = lane.meta(i + len);
        if (next.kind != EntryKind::kCompletion || next.slot != first.slot ||
            next.generation != first.generation) {
          break;
        }
        len += std::min<uint32_t>(next.run, end - i - len);
      }
      delivered += DeliverRun(&lane.wc(i), len, first.slot, first.generation);
      i += len;
    } else {
      if (first.kind == EntryKind::kEventPart) {
        DeliverEvent(lane.join(i), first.slot, first.generation);
      } else if (first.kind == EntryKind::kListenerEvent) {
        DeliverListenerEvent(lane.join(i));
      } else {
        DeliverMarker(first.slot, first.generation, lane.wc(i));
      }
      ++i;
    }
    if (slot_ahead < i) slot_ahead = i;
    if (slot_ahead < end) slot_ahead = PrefetchRun(lane, slot_ahead, end, PrefetchStage::kSlot);
    if (handler_ahead < i) handler_ahead = i;
    if (handler_ahead < end)
      handler_ahead = PrefetchRun(lane, handler_ahead, end, PrefetchStage::kHandler);
  }
  CountDelivered(delivered);
}

void Consumer::RunItem(const Item& item) noexcept {
  switch (item.kind) {
    case EntryKind::kCompletion:
      CountDelivered(DeliverRun(&item.wc, 1, item.slot, item.generation));
      break;
    case EntryKind::kEventPart:
      DeliverEvent(item.join, item.slot, item.generation);
      break;
    case EntryKind::kListenerEvent:
      DeliverListenerEvent(item.join);
      break;
    case EntryKind::kTeardownMarker:
      DeliverMarker(item.slot, item.generation, item.wc);
      break;
  }
}

size_t Consumer::DeliverRun(const ibv_wc* wcs, size_t n, uint32_t slot_index,
                            uint32_t generation) noexcept {
  Slot& slot = slots_.slot(slot_index);
  EnterCall(slot_index);
  ChaosPoint();  // between the call's store and the state read Unregister's fence pairs with
  if (RouteAtConsumer(EntryKind::kCompletion, slot, generation) == Disposal::kDeliver) {
    slot.handler.load(std::memory_order_relaxed)->OnCompletions({wcs, n});
    return n;
  }
  LeaveCall();              // nobody's handler runs for it: Unregister need not wait
  orphans_.Take({wcs, n});  // unregistered after it was routed here
  return 0;
}

bool Consumer::DeferHeldEvents(HeldEvents* held) noexcept {
  if (tls_dispatch_frames == nullptr) return false;
  if (tls_held_to_run != nullptr && tls_held_to_run != held) {
    held->DeliverAll();  // another runtime's come first (a handler draining another runtime)
    return true;
  }
  tls_held_to_run = held;
  return true;
}

bool Consumer::OnConsumerThread() noexcept { return tls_dispatch_frames != nullptr; }

bool Consumer::DispatchingHere() const noexcept { return DispatchingOnThisThread(this); }

}  // namespace cqd::internal
