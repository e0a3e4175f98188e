// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/event_inbox.h"

#include "runtime/base/chaos.h"

namespace cqd::internal {

bool EventInbox::Post(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b) {
  MutexLock lock(mu_);
  if (!open_) {
    // The shard has stopped (Shutdown): nothing it polled is still held, so hand it over now.
    Item copy = item;
    spills_.PlaceBehindLane(consumer, copy);
    return spills_.consumer(consumer).PushIfOpen(spills_.token(consumer), copy);
  }
  inbox_.push_back({consumer, item, {cq_a, cq_b}});
  pending_.store(true, std::memory_order_seq_cst);
  lock.Unlock();
  parker_.Wake();
  return true;
}

int EventInbox::Poll() {
  if (!pending_.load(std::memory_order_acquire) && deferred_.empty()) return 0;
  return Place() ? 1 : 0;  // events, each behind its catch-up
}

bool EventInbox::TryEnterIdle() {
  // Posted since the last pass (the event thread sets the flag before it wakes the shard): the
  // next pass places it.
  if (pending_.load(std::memory_order_seq_cst)) return false;
  if (deferred_.empty()) return true;
  // An event held back for want of lane room: its consumer wakes the sleeper when it frees room.
  for (const PostedEvent& posted : deferred_) {
    spills_.lane(posted.consumer).wants_room.store(true, std::memory_order_seq_cst);
  }
  ChaosPoint();  // asked, not yet looked again
  // Room freed before the stores above was not woken for: look for it now. An event waits for
  // lane room or for its CQs' catch-up; either way the spills stage, after this one, completes
  // the Dekker pair with the consumer (its release of room and seq_cst depth_.fetch_sub or fence,
  // then its load of wants_room) for every lane that holds entries, including the ones a catch-up
  // here fills.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // A catch-up that took completions did work even when no event moved: its flush may have handed
  // a whole spill over (the lane leaves the spills' list, so the spills stage would not ask for
  // its room, and the event it freed room for would wait for a wake nobody owes).
  const uint64_t polled = counters_.completions.load(std::memory_order_relaxed);
  const bool placed = Place();
  return !placed && counters_.completions.load(std::memory_order_relaxed) == polled;
}

bool EventInbox::Place() {
  if (pending_.exchange(false, std::memory_order_acq_rel)) {
    MutexLock lock(mu_);
    deferred_.insert(deferred_.end(), inbox_.begin(), inbox_.end());
    inbox_.clear();
  }
  // In posting order. One that cannot be placed yet stays, and so do later ones for the same
  // consumer, which keeps each consumer's events in order.
  bool moved = false;
  size_t kept = 0;
  held_.assign(spills_.consumer_count(), false);
  for (size_t i = 0; i < deferred_.size(); ++i) {
    PostedEvent& posted = deferred_[i];
    if (held_[posted.consumer] || !CatchUp(posted) || spills_.lane(posted.consumer).room() == 0) {
      held_[posted.consumer] = true;
      deferred_[kept++] = posted;
      continue;
    }
    spills_.AppendEvent(posted.consumer, posted.item);
    moved = true;
  }
  deferred_.resize(kept);
  return moved;
}

bool EventInbox::CatchUp(PostedEvent& posted) noexcept {
  for (int k = 0; k < 2; ++k) {
    if (posted.cq_ids[k] == 0 || (posted.caught_up & (1u << k))) continue;
    if (!cqs_.CatchUp(posted.cq_ids[k], posted.polled[k])) return false;
    posted.caught_up |= 1u << k;
  }
  return true;
}

void EventInbox::Close() {
  // PostEvent waits on mu_ meanwhile and afterwards hands events over directly, behind everything
  // this flush moved.
  MutexLock lock(mu_);
  for (PostedEvent& posted : inbox_) deferred_.push_back(posted);
  inbox_.clear();
  spills_.Flush(/*force=*/true);
  // Behind everything the lanes handed over, each event on its own (it needs no lane room).
  for (PostedEvent& posted : deferred_) spills_.PushAlone(posted.consumer, posted.item);
  deferred_.clear();
  open_ = false;
}

}  // namespace cqd::internal
