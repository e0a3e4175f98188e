// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/spills.h"

#include <algorithm>
#include <chrono>

#include "runtime/base/chaos.h"

namespace cqd::internal {

using Clock = std::chrono::steady_clock;

Spills::Spills(int index, const std::vector<Consumer*>& consumers, int poll_batch, bool hold)
    : index_(index),
      poll_batch_(static_cast<uint32_t>(poll_batch)),
      hold_(hold),
      consumers_(consumers) {
  for (Consumer* c : consumers_) {
    tokens_.push_back(c->MakeProducerToken());
    lanes_.push_back(&c->lane(index_));
  }
  listed_.reserve(consumers_.size());
}

int Spills::Poll() noexcept {
  // Spills the CQ stage holds are its to hand over, later in this pass.
  if (listed_.empty() || held_passes_ > 0) return 0;
  return Flush(false) ? 1 : 0;
}

bool Spills::TryEnterIdle() noexcept {
  if (listed_.empty()) return true;
  // A spill a full consumer holds back: its next batch that frees room wakes the sleeper
  // (consumer.h), so the sleep need not be bounded for it.
  for (uint32_t consumer : listed_) {
    lanes_[consumer]->wants_room.store(true, std::memory_order_seq_cst);
  }
  ChaosPoint();  // asked, not yet looked again
  // Room freed before the stores above was not woken for: look for it now (the consumer's
  // release of room and seq_cst depth_.fetch_sub or fence, then its load of wants_room, make the
  // other half of the pair).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return !Flush(false);
}

int Spills::EndHold(int found) noexcept {
  holding_ = false;
  if (found > 0 && polls_full_ && held_passes_ < kMaxHeldPasses && MayHold()) {
    ++held_passes_;
    return 0;
  }
  if (listed_.empty()) return 0;
  return Flush(false) ? 1 : 0;
}

bool Spills::MayHold() noexcept {
  bool held = false;
  for (uint32_t consumer : listed_) {
    Lane& lane = *lanes_[consumer];
    if (lane.direct) continue;  // dispatched from the spill, not handed over (HostedConsumers)
    if (lane.room() < poll_batch_ ||
        lane.spill_size() + poll_batch_ > kHeldBatches * consumers_[consumer]->dispatch_batch()) {
      return false;
    }
    held = true;
  }
  return held;
}

void Spills::AppendCompletion(uint32_t consumer, const EntryMeta& meta, const ibv_wc& wc) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.room() == 0) [[unlikely]] {
    // A CQ's completions go only to consumers among its uses, whose room bounded the poll; this
    // is the last line of defence should that ever not hold: the spill is handed over past the
    // queue bound, and this completion behind it on its own.
    FlushOne(consumer, /*force=*/true);
    Item item;
    item.wc = wc;
    item.slot = meta.slot;
    item.generation = meta.generation;
    item.kind = meta.kind;
    item.stamp = meta.stamp;
    PushAlone(consumer, item);
    return;
  }
  const uint32_t at = lane.tail_at();
  lane.wc(at) = wc;
  lane.meta(at) = meta;
  lane.Append();
  List(consumer);
}

void Spills::AppendEvent(uint32_t consumer, const Item& item) noexcept {
  Lane& lane = *lanes_[consumer];  // the caller saw room()
  const uint32_t at = lane.tail_at();
  lane.SetJoin(at, item.join);
  lane.meta(at) = {item.slot, item.generation, item.kind, 1, 0};
  lane.Append();
  List(consumer);
}

bool Spills::Flush(bool force) noexcept {
  held_passes_ = 0;
  bool moved = false;
  size_t kept = 0;
  for (size_t i = 0; i < listed_.size(); ++i) {
    uint32_t consumer = listed_[i];
    Lane& lane = *lanes_[consumer];
    // A run-to-completion consumer of this shard with nothing queued is dispatched straight
    // from the spill (HostedConsumers), unless the spill fills up: then the queue takes it.
    const bool direct =
        lane.direct && !force && !lane.spill_full() && !consumers_[consumer]->Pending();
    if (!direct) moved |= FlushOne(consumer, force);
    NoteSpill(consumer);
    if (lane.spill_empty()) {
      lane.listed = false;
    } else {
      listed_[kept++] = consumer;
    }
  }
  listed_.resize(kept);
  return moved;
}

bool Spills::FlushOne(uint32_t consumer, bool force) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.spill_empty()) return false;
  Consumer& c = *consumers_[consumer];
  const uint32_t n = lane.spill_size();
  size_t take = n;
  if (force) {
    c.Reserve(n);
  } else {
    take = c.ReserveUpTo(n);
    if (take == 0) return false;
  }
  // A run cut here must not reach into what stays (lane.h).
  if (take < n) lane.CapRunsAt(lane.published() + take);
  ChaosPoint();  // reserved, not yet handed over
  lane.Publish(static_cast<uint32_t>(take));
  c.HandedOver();
  return true;
}

void Spills::PushAlone(uint32_t consumer, Item& item) noexcept {
  PlaceBehindLane(consumer, item);
  consumers_[consumer]->Reserve(1);
  consumers_[consumer]->PushAlone(tokens_[consumer], item);
}

void Spills::NoteSpill(uint32_t consumer) noexcept {
  Lane& spill = *lanes_[consumer];
  uint64_t size = spill.spill_size();
  spill.depth_stat.store(size, std::memory_order_relaxed);
  if (size > spill.high_water.load(std::memory_order_relaxed)) {
    spill.high_water.store(size, std::memory_order_relaxed);
  }
  if (spill.spill_full() != spill.stalled) {  // a stall starts or ends: rare: read the clock
    Clock::time_point now = Clock::now();
    spill.stalled = spill.spill_full();
    if (spill.stalled) {
      spill.full_since = now;
      spill.stalled_since_ns.store(
          std::max<int64_t>(
              1,
              std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()),
          std::memory_order_relaxed);
      Count(spill.stalls, 1);
    } else {
      // Ended first, then the time added (release): see Lane::stalled_ns.
      spill.stalled_since_ns.store(0, std::memory_order_relaxed);
      const uint64_t stalled =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - spill.full_since).count();
      spill.stalled_ns.store(spill.stalled_ns.load(std::memory_order_relaxed) + stalled,
                             std::memory_order_release);
    }
  }
}

void Spills::AddStats(uint32_t consumer, ConsumerStats& out) const {
  const Lane& spill = *lanes_[consumer];
  out.spill_depth += spill.depth_stat.load(std::memory_order_relaxed);
  out.spill_high_water =
      std::max(out.spill_high_water, spill.high_water.load(std::memory_order_relaxed));
  out.stalls += spill.stalls.load(std::memory_order_relaxed);
  // Acquire: a stall this includes has ended for the load below too (Lane::stalled_ns).
  uint64_t stalled = spill.stalled_ns.load(std::memory_order_acquire);
  // The stall in progress counts too, so that an alert on stalled time sees a stuck consumer.
  if (const int64_t since = spill.stalled_since_ns.load(std::memory_order_relaxed); since != 0) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const uint64_t stall = now > since ? static_cast<uint64_t>(now - since) : 0;
    stalled += stall;
    out.stall_ns = std::max(out.stall_ns, stall);
  }
  // A counter: never below what an earlier snapshot reported (one that missed a stall ending
  // between the two loads above would be).
  uint64_t reported = spill.stalled_ns_reported.load(std::memory_order_relaxed);
  while (reported < stalled && !spill.stalled_ns_reported.compare_exchange_weak(
                                   reported, stalled, std::memory_order_relaxed)) {
  }
  out.stalled_ns += std::max(reported, stalled);
}

}  // namespace cqd::internal
