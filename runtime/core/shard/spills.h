// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/spills.h: the shard's stage that hands what it polled to the consumers.
//
// The shard writes into its own lane of each consumer (lane.h); the part of a lane not yet handed
// over is its spill. A hand-over reserves depth in the consumer's queue (as much as it has room
// for) and publishes the lane's new end: the consumer reads the position itself, so nothing but
// that store and the reservation crosses cores per hand-over. A consumer whose queue is full
// leaves its entries in the spill; a CQ whose consumers' spills are full is not polled (RoomFor),
// so its completions wait in the CQ, never dropped.
//
// The hold: while every poll of a runtime-owned shard's CQ stage comes back full, what it routed
// stays in the spills for up to kMaxHeldPasses passes, until a spill holds nearly kHeldBatches
// consumer batches: a hand-over moves the same lines between the cores whatever it carries, and
// the consumer's later batches of one hand-over find them still in its cache. A poll that comes
// back short of full (the CQ is empty: no more to wait for), a spill that could not take
// another poll, a sleep, Stop and an engine-driven step hand everything over at once.
//
// As a stage: Poll hands the spills over (unless the CQ stage holds them); TryEnterIdle asks each
// consumer whose spill is held back to wake the shard when it frees room (Lane::wants_room), then
// looks for room once more, so that a stuck consumer costs its shard nothing (nor do the CQs only
// it holds back: the CQ stage leaves them unarmed, HeldBack); ExitIdle takes the asking back once
// the sleep is over.
//
// Threading: the shard's driver only (shard.h). A run-to-completion consumer's lane is `direct`:
// its shard dispatches it straight from the spill (HostedConsumers) and hands over only what the
// spill cannot hold.
#ifndef CQD_RUNTIME_CORE_SHARD_SPILLS_H_
#define CQD_RUNTIME_CORE_SHARD_SPILLS_H_

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "concurrentqueue/concurrentqueue.h"
#include "cqd/stats.h"
#include "runtime/core/consumer.h"
#include "runtime/core/lane.h"
#include "runtime/core/records.h"
#include "runtime/core/shard/counters.h"

namespace cqd::internal {

class Spills {
 public:
  // `index`: the shard's; `hold`: the hold may gather (a runtime-owned shard).
  Spills(int index, const std::vector<Consumer*>& consumers, int poll_batch, bool hold);
  Spills(const Spills&) = delete;
  Spills& operator=(const Spills&) = delete;

  Lane& lane(uint32_t consumer) noexcept { return *lanes_[consumer]; }
  Consumer& consumer(uint32_t consumer) noexcept { return *consumers_[consumer]; }
  size_t consumer_count() const noexcept { return consumers_.size(); }
  // Nothing is held for any consumer.
  bool empty() const noexcept { return listed_.empty(); }
  // How many completions `cq` may be polled for now (0: skip it): the fullest spill of the
  // consumers it serves bounds it.
  int RoomFor(const CqRecord& cq) noexcept {
    int room = poll_batch_;
    for (const CqRecord::Use& use : cq.uses) {
      room = std::min<int>(room, static_cast<int>(lanes_[use.consumer]->room()));
    }
    return room;
  }

  // Stage: hands the spills over unless the CQ stage holds them; returns 1 if anything moved.
  int Poll() noexcept;
  // Stage: true if the shard may sleep as far as the spills go (see above).
  bool TryEnterIdle() noexcept;
  // Returns true if `cq` need not be armed for the sleep TryEnterIdle allowed: a consumer it
  // serves has no room and still asks to wake the shard when it frees some, and until then the CQ
  // cannot be polled anyway. (An event from it would only wake the shard to skip it again, once
  // per completion that comes meanwhile.) A consumer that took the asking back has woken the
  // shard already, so its CQs are armed as usual.
  bool HeldBack(const CqRecord& cq) noexcept {
    for (const CqRecord::Use& use : cq.uses) {
      Lane& lane = *lanes_[use.consumer];
      if (lane.room() == 0 && lane.wants_room.load(std::memory_order_seq_cst)) return true;
    }
    return false;
  }
  // Stage: the sleep is over: the consumers need not wake the shard for room any more.
  void ExitIdle() noexcept {
    for (uint32_t consumer : listed_) {
      lanes_[consumer]->wants_room.store(false, std::memory_order_relaxed);
    }
  }

  // The CQ stage's hold (see above): Begin before its polls, NoteShortPoll for a poll that came
  // back short of full, AfterPoll after each poll that took `taken` (hands over unless holding),
  // and EndHold with what the stage found.
  void BeginHold() noexcept {
    holding_ = hold_;
    polls_full_ = true;
  }
  void NoteShortPoll() noexcept { polls_full_ = false; }
  void AfterPoll(int taken) noexcept {
    if (taken > 0 && !(holding_ && polls_full_ && MayHold())) Flush(false);
  }
  // Ends the hold: the spills stay held for another pass if the stage found `found` > 0 in full
  // polls and they may; else they are handed over. Returns 1 if anything moved, else 0.
  int EndHold(int found) noexcept;

  // Routing's writes into the lanes (the caller saw room, but for AppendCompletion's defence).
  void List(uint32_t consumer) noexcept {
    Lane& lane = *lanes_[consumer];
    if (!lane.listed) {
      lane.listed = true;
      listed_.push_back(consumer);
    }
  }
  void AppendCompletion(uint32_t consumer, const EntryMeta& meta, const ibv_wc& wc) noexcept;
  void AppendEvent(uint32_t consumer, const Item& item) noexcept;

  // Hands the lanes' spills to their consumers' queues; returns true if anything moved. With
  // `force`, everything moves regardless of capacity (Stop).
  bool Flush(bool force) noexcept;
  // Reserves and queues `item` for `consumer` on its own, behind what this shard's lane of it
  // has handed over so far.
  void PushAlone(uint32_t consumer, Item& item) noexcept;
  // Names in `item` this shard's lane of `consumer` and how far it has handed over: the item
  // goes behind that (lane.h, Item). Any thread once the driver has stopped for good.
  void PlaceBehindLane(uint32_t consumer, Item& item) const noexcept {
    item.shard = static_cast<uint32_t>(index_);
    item.after = lanes_[consumer]->published();
  }
  moodycamel::ProducerToken& token(uint32_t consumer) noexcept { return tokens_[consumer]; }
  // Updates `consumer`'s spill statistics (depth, high water, stalls).
  void NoteSpill(uint32_t consumer) noexcept;
  // Adds this shard's spill figures for `consumer` to `out`. Any thread.
  void AddStats(uint32_t consumer, ConsumerStats& out) const;

 private:
  bool FlushOne(uint32_t consumer, bool force) noexcept;
  // True if the spills may be held for another poll: some lane of a queued consumer has a
  // spill, and every such spill can take another poll and stays within kHeldBatches consumer
  // batches.
  bool MayHold() noexcept;

  // The most passes the CQ stage holds the spills for, and the consumer batches (dispatch_batch)
  // a held spill may reach. Four: in the VM's slow cross-core mode they took the handoff at batch
  // 32 from about the mutex pipeline's rate to 1.4x it; eight gained at most a few percent more
  // in the fast mode (docs/PERFORMANCE.md, "Small poll batches").
  static constexpr uint32_t kMaxHeldPasses = 16;
  static constexpr uint32_t kHeldBatches = 4;

  const int index_;
  const uint32_t poll_batch_;
  const bool hold_;
  std::vector<Consumer*> consumers_;
  std::vector<moodycamel::ProducerToken> tokens_;  // one per consumer
  std::vector<Lane*> lanes_;                       // one per consumer: this shard's lane
  std::vector<uint32_t> listed_;                   // consumers whose spill is not empty
  // The hold: while `holding_`, AfterPoll leaves handing over to the stage's end, unless a poll
  // came back short (`polls_full_` false) or the spills could not take another poll.
  // `held_passes_` counts the passes since the spills were last handed over (Flush clears it).
  bool holding_ = false;
  bool polls_full_ = false;
  uint32_t held_passes_ = 0;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_SPILLS_H_
