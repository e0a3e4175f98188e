// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/lane.h: the memory a shard hands completions to one consumer in (its lane), and
// the entries that travel outside any lane (Item).
//
// A lane is a single-producer, single-consumer ring of entries, each a 48-byte ibv_wc and a
// 16-byte EntryMeta kept apart (two arrays), owned by the consumer, written by one shard. The
// shard polls a CQ whose registered QPs all go to one consumer straight into that consumer's
// lane, and writes only the metadata (slot, generation, kind) beside each completion; completions
// of a CQ shared by consumers are polled into the shard's scratch array and copied once into
// their lanes. Nothing copies a completion after that: the consumer's handlers read their spans
// in the lane.
//
// Positions only grow; entry `pos` lives at index pos % size(). Three positions split the ring:
//
//   recycled <= published <= tail
//   [recycled, published)  handed to the consumer, which reads `published` itself (acquire) and
//                          recycles entries in order once their handlers have returned. No queue
//                          item names them: the position is the hand-over.
//   [published, tail)      the spill: polled, not yet handed over because the consumer had no
//                          room (at most `spill_limit` entries). A run-to-completion consumer's
//                          own shard dispatches straight from here (HostedConsumers).
//
// size() = queue_capacity + spill_limit: the queue bound (depth, consumer.h) keeps the handed-over
// part within queue_capacity, so the ring has room for the spill without the poller reading the
// consumer's position. It reads `recycled` (acquire) only when its cached copy says the ring may
// be full (which Shutdown's forced hand-over can bring about) and in TryRewind, once per
// kRewindEvery entries past kRewindFrom, so the line the consumer writes per batch rarely
// crosses back.
//
// Runs (EntryMeta::run) handed to the consumer never reach past `published`: a hand-over that
// cuts a run caps it first (CapRunsAt), so that Filter, which rewrites the spill, never changes
// what a handed-over run covers. (A run-to-completion consumer's poller, which takes entries for
// dispatch on its own thread, caps them at its batch's end instead, and recycles them before any
// batch could read them again.)
//
// Threading: tail, the spill and its stats belong to the poller thread (PurgeDead's Filter too,
// between polls: a call made mid-pass settles the fused poll first); it stores `published`
// (release) after writing the entries it hands over. `recycled` is written by the one thread
// dispatching the consumer (release), after its handlers returned, and by the poller's TryRewind
// while nothing is handed over; the dispatching thread reads entries between its acquire load of
// `published` and its store.
#ifndef CQD_RUNTIME_CORE_LANE_H_
#define CQD_RUNTIME_CORE_LANE_H_

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace cqd::internal {

struct EventJoin;

// kCompletion: a work completion for a registration.
// kEventPart: a part of an EventJoin for a registration (async, fence or CM event).
// kTeardownMarker: a completion of a TeardownQp marker work request (teardown.h).
// kListenerEvent: a CM event for a channel's CmHandler (EventJoin kind kListener; slot kNoSlot).
enum class EntryKind : uint16_t { kCompletion, kEventPart, kTeardownMarker, kListenerEvent };
inline constexpr uint32_t kNoSlot = ~uint32_t{0};
// True for the kinds whose entry carries an EventJoin in its wc's place.
constexpr bool CarriesEvent(EntryKind kind) noexcept {
  return kind == EntryKind::kEventPart || kind == EntryKind::kListenerEvent;
}

// What the runtime knows of one lane entry besides its ibv_wc.
struct EntryMeta {
  uint32_t slot;
  uint32_t generation;
  EntryKind kind;
  // Completions: how many entries from this one on (this one included) are completions of the
  // same registration, routed by one poll; at least 1. The consumer hands each run to its
  // handler in one call and reads its registration once per run, not entry by entry.
  uint16_t run;
  uint32_t stamp;  // completions: when polled, if latency is recorded (latency.h)
};
static_assert(sizeof(EntryMeta) == 16);

// One entry that travels by itself, through the consumer's queue of items (consumer.h): an event
// posted after the shard stopped, or what Shutdown's hand-over and the routing guard push. It
// goes behind every entry of lane `lane` before position `after`, and ahead of the lane's later
// ones: the consumer stops reading the lane at `after` until the item has run.
struct Item {
  Item() : wc{} {}
  union {
    ibv_wc wc;        // kCompletion, kTeardownMarker
    EventJoin* join;  // kEventPart, kListenerEvent
  };
  uint32_t slot = 0;
  uint32_t generation = 0;
  EntryKind kind = EntryKind::kCompletion;
  uint32_t stamp = 0;
  uint64_t after = 0;  // set by the producer that queues it
  uint32_t shard = 0;  // whose lane it goes behind (the lane of that shard's index)
};

class Lane {
 public:
  Lane(uint32_t index, uint32_t spill_limit, uint64_t queue_capacity)
      : index_(index),
        spill_limit_(spill_limit),
        size_(queue_capacity + spill_limit),
        // Default-initialized: pages are touched as the ring first reaches them.
        wcs_(AllocateRing<ibv_wc>(size_)),
        metas_(AllocateRing<EntryMeta>(size_)) {}
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  uint32_t index() const noexcept { return index_; }
  uint64_t size() const noexcept { return size_; }
  uint32_t IndexOf(uint64_t pos) const noexcept { return static_cast<uint32_t>(pos % size_); }
  ibv_wc& wc(uint32_t at) noexcept { return wcs_[at]; }
  EntryMeta& meta(uint32_t at) noexcept { return metas_[at]; }
  // The event part an entry of kind kEventPart or kListenerEvent carries in its wc's place.
  EventJoin* join(uint32_t at) const noexcept {
    EventJoin* join;
    std::memcpy(&join, &wcs_[at], sizeof(join));
    return join;
  }

  // Poller side.
  uint32_t spill_size() const noexcept {
    return static_cast<uint32_t>(tail_ - published_.load(std::memory_order_relaxed));
  }
  bool spill_empty() const noexcept { return tail_ == published_.load(std::memory_order_relaxed); }
  bool spill_full() const noexcept { return spill_size() >= spill_limit_; }
  // Returns how many entries may be appended now.
  uint32_t room() noexcept {
    if (tail_at_ >= rewind_check_at_ && spill_empty()) [[unlikely]]
      TryRewind();
    const uint32_t spill_room = spill_limit_ - std::min(spill_limit_, spill_size());
    if (size_ - (tail_ - recycled_seen_) >= spill_room) return spill_room;
    recycled_seen_ = recycled_.load(std::memory_order_acquire);
    return static_cast<uint32_t>(std::min<uint64_t>(spill_room, size_ - (tail_ - recycled_seen_)));
  }
  // Returns how many entries fit at the tail without wrapping (callers also respect room()).
  uint32_t contiguous() const noexcept { return static_cast<uint32_t>(size_ - tail_at_); }
  uint32_t tail_at() const noexcept { return tail_at_; }
  // Requires room() > 0. Appends the entry at tail_at().
  void Append() noexcept { Advance(1); }
  // Requires n <= room() and n <= contiguous(): entries [tail_at(), tail_at() + n) were written.
  void Advance(uint32_t n) noexcept {
    tail_ += n;
    tail_at_ += n;
    if (tail_at_ == size_) {
      tail_at_ = 0;
      rewind_check_at_ = kRewindFrom;
    }
  }
  // Writes an event entry at the tail (the caller appends it).
  void SetJoin(uint32_t at, EventJoin* join) noexcept {
    std::memcpy(&wcs_[at], &join, sizeof(join));
  }
  // Poller thread; any thread once the shard has stopped (acquire).
  uint64_t published() const noexcept { return published_.load(std::memory_order_acquire); }
  uint64_t tail() const noexcept { return tail_; }
  // Hands the first `n` spill entries over (or takes them for dispatch): a release store that
  // publishes them.
  void Publish(uint32_t n) noexcept {
    published_.store(published_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
  // Before Publish(end - published()) with `end` short of tail(): cuts the runs that reach past
  // `end` there, so that no run handed over reaches into the spill (see the header).
  void CapRunsAt(uint64_t end) noexcept {
    for (uint64_t pos = end; pos-- != published_.load(std::memory_order_relaxed);) {
      EntryMeta& meta = metas_[IndexOf(pos)];
      if (meta.kind != EntryKind::kCompletion || meta.run <= end - pos) return;
      meta.run = static_cast<uint16_t>(end - pos);
    }
  }

  // Keeps the spill entries for which keep(meta, at) is true, in order; returns how many were
  // removed. Poller thread, between polls: a call made mid-pass settles the fused poll first.
  template <typename Keep>
  uint32_t Filter(Keep&& keep) {
    const uint64_t published = published_.load(std::memory_order_relaxed);
    uint64_t write = published;
    for (uint64_t read = published; read != tail_; ++read) {
      const uint32_t from = IndexOf(read);
      if (!keep(metas_[from], from)) continue;
      if (write != read) {
        const uint32_t to = IndexOf(write);
        wcs_[to] = wcs_[from];
        metas_[to] = metas_[from];
      }
      ++write;
    }
    const uint32_t removed = static_cast<uint32_t>(tail_ - write);
    tail_ = write;
    tail_at_ = IndexOf(tail_);
    if (removed > 0) {  // a run may have lost entries: count them again, back to front
      uint16_t next = 0;
      for (uint64_t pos = tail_; pos-- != published;) {
        EntryMeta& meta = metas_[IndexOf(pos)];
        const bool joins = next > 0 && meta.kind == EntryKind::kCompletion &&
                           metas_[IndexOf(pos + 1)].kind == EntryKind::kCompletion &&
                           metas_[IndexOf(pos + 1)].slot == meta.slot &&
                           metas_[IndexOf(pos + 1)].generation == meta.generation &&
                           next < UINT16_MAX;
        meta.run = joins ? static_cast<uint16_t>(next + 1) : 1;
        next = meta.run;
      }
    }
    return removed;
  }

  // Poller side, with the spill empty: if the consumer has recycled everything handed over,
  // jumps to the start of the next lap, so that a lane that keeps up cycles through its first
  // kRewindFrom entries (a few dozen KB that stay in cache) instead of the whole ring. Checked
  // once per kRewindEvery entries past kRewindFrom: the read crosses to the consumer's core.
  // (A run-to-completion consumer's poller, whose thread is the consumer, calls it after each
  // dispatch from the spill instead: HostedConsumers::DispatchOne.)
  // Both positions jump: `recycled` first, then `published` (release), so a consumer that reads
  // `published` and then `recycled` (GatherLane) sees either both old or `recycled` at least the
  // lap; it never reads the entries skipped. The store cannot race the consumer's: it has
  // recycled everything handed over, and stores again only for a range handed over after this.
  void TryRewind() noexcept {
    rewind_check_at_ = tail_at_ + kRewindEvery;
    recycled_seen_ = recycled_.load(std::memory_order_acquire);
    if (recycled_seen_ != tail_) return;
    const uint64_t lap = tail_ + (size_ - tail_at_);
    tail_ = recycled_seen_ = lap;
    tail_at_ = 0;
    rewind_check_at_ = kRewindFrom;
    recycled_.store(lap, std::memory_order_relaxed);
    published_.store(lap, std::memory_order_release);
  }

  // Consumer side (the dispatching thread).
  // Returns how far entries are handed over (acquire: the entries before it are written). Read
  // it before recycled() (see TryRewind).
  uint64_t HandedUpTo() const noexcept { return published_.load(std::memory_order_acquire); }
  // Returns the first entry not yet recycled: this thread's last store, or a rewind's.
  uint64_t recycled() const noexcept { return recycled_.load(std::memory_order_relaxed); }
  // Every entry before `pos` may be reused.
  void Recycle(uint64_t pos) noexcept { recycled_.store(pos, std::memory_order_release); }
  // Dispatching thread, a hint: starts loading the lines of the entry the next range most likely
  // begins at (the first one not recycled), so that they cross cores beside the published
  // position, not after it.
  void PrefetchNext() const noexcept {
    const uint32_t at = IndexOf(recycled_.load(std::memory_order_relaxed));
    __builtin_prefetch(&metas_[at]);
    __builtin_prefetch(&wcs_[at]);
  }

  // Spill stats (poller writes, anyone reads), on a line of their own.
  alignas(64) std::atomic<uint64_t> depth_stat{0};  // spill_size() after the poller's last change
  std::atomic<uint64_t> high_water{0};              // most entries the spill held at once
  std::atomic<uint64_t> stalls{0};  // times the spill filled up (its CQs were skipped)
  // Time spent full, summed over stalls that ended. A stall ends with stalled_since_ns cleared
  // first, then this stored with release: a reader that loads this (acquire) and sees the stall
  // added also sees it ended, so it never counts a stall twice (it may miss one just ending).
  std::atomic<uint64_t> stalled_ns{0};
  // Steady-clock ns when the stall in progress began; 0: none (poller-written, read by GetStats).
  std::atomic<int64_t> stalled_since_ns{0};
  // The most stalled time GetStats has reported for this lane (readers, fetch-max): a reading
  // that missed a stall just ending reports this instead, so the counter never goes down.
  mutable std::atomic<uint64_t> stalled_ns_reported{0};
  std::chrono::steady_clock::time_point full_since{};  // poller-owned: start of the current stall
  bool stalled = false;                                // poller-owned
  bool listed = false;  // poller-owned: in the shard's list of lanes with a spill
  // Poller-owned, set once: the lane of a run-to-completion consumer of this shard, which
  // dispatches straight from the spill while the consumer's queue is empty.
  bool direct = false;

 private:
  // Read by both sides, written once: a line that never changes.
  alignas(64) const uint32_t index_;
  const uint32_t spill_limit_;
  const uint64_t size_;
  // The rings start on a page: where the allocator put them (the heap, or a mapping whose first
  // 16 bytes it keeps) decided which cache lines a poll's entries straddle and which neighbour
  // shares the ring's first line, and with it the handoff's speed in the VM's slow cross-core mode.
  struct FreeRing {
    void operator()(void* ring) const noexcept { std::free(ring); }
  };
  template <typename T>
  static T* AllocateRing(uint64_t n) {
    static_assert(std::is_trivially_default_constructible_v<T>);
    constexpr size_t kPage = 4096;
    const size_t bytes = (n * sizeof(T) + kPage - 1) / kPage * kPage;
    void* ring = std::aligned_alloc(kPage, bytes);
    if (ring == nullptr) throw std::bad_alloc();
    return static_cast<T*>(ring);
  }
  const std::unique_ptr<ibv_wc[], FreeRing> wcs_;
  const std::unique_ptr<EntryMeta[], FreeRing> metas_;
  // Poller-owned, written per poll: a line the consumer never reads.
  alignas(64) uint64_t tail_ = 0;
  uint32_t tail_at_ = 0;        // IndexOf(tail_)
  uint64_t recycled_seen_ = 0;  // the last value read from recycled_
  static constexpr uint32_t kRewindFrom = 1024;
  static constexpr uint32_t kRewindEvery = 256;
  uint64_t rewind_check_at_ = kRewindFrom;  // tail_at_ at which TryRewind looks next
  // Written by the poller per hand-over, read by the dispatching thread per batch.
  alignas(64) std::atomic<uint64_t> published_{0};
  // Written by the dispatching thread, read by the poller now and then.
  alignas(64) std::atomic<uint64_t> recycled_{0};

 public:
  // Back-pressure's wake-up (consumer.h): the poller sets it (seq_cst) before it sleeps with
  // entries in this lane's spill or an event held back for it, then re-checks for room; the
  // dispatching thread frees room (Recycle: release), then, after a seq_cst operation (Dispatch's
  // depth_.fetch_sub, DispatchLane's fence), takes it (exchange) and wakes the poller.
  // On recycled_'s line, which the dispatching thread writes per batch anyway.
  std::atomic<bool> wants_room{false};

 private:
  [[maybe_unused]] char pad_[64 - sizeof(std::atomic<uint64_t>) - sizeof(std::atomic<bool>)];
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_LANE_H_
