// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/fences.h: what a retired QP may still have in a CQ, and when that is over.
//
// A fence stands for one side (send or receive) of a retired QP on one CQ: a plain Unregister,
// or a teardown that ended before everything it flushed there was polled. It holds that side's
// commitment on the CQ (CqRecord::leftover_commit, which the capacity guard counts) and ends in
// one of two ways, whichever comes first:
//   - its marker: the teardown marker the QP posted on that queue, when a poll takes it off the
//     CQ (in any order with the other side's marker). Everything the QP flushed on that queue
//     was ahead of it (S10). The marker is the runtime's: neither a handler nor the
//     OrphanHandler sees it.
//   - a catch-up: once started, it is over when a poll finds the CQ empty or the CQ has yielded
//     its depth's worth of completions since: everything that was in it at the start has been
//     polled. It starts at once for a plain Unregister (whose work the engine knows is complete),
//     and for every fence of a qp_num on a CQ when a new QP with that number registers there: a
//     device gives a number out again only after the QP that had it was destroyed, so every
//     completion the old QP will ever have is in the CQ by then (or was cleaned out of it).
// A side with no marker to wait for (its receive marker found no room in the queue; an SRQ QP's
// receive side without LAST_WQE_REACHED) is "unfenced": only a catch-up, or the CQ's removal,
// ends it.
//
// The catch-up's premise fails when the retired QP itself, never destroyed, registers again: it
// may still flush its marker after any catch-up (the simulated device holds a flush back while
// the CQ has no room, until the QP is moved to error again). A QP that registers in the error
// state, as the same native object a fence stands for, on a device that has not failed, is taken
// for it: that fence, if it awaits a marker, ends only by its marker (AwaitMarkers), and
// RegisterQp refuses until it has come back. (A new QP starts in RESET, and a new object at the
// same address would also have to be in error to be taken for the old one.)
//
// While a fence awaits its marker, every completion of its (CQ, qp_num) is the retired QP's (it
// flushed ahead of the marker): it goes to the orphan sink. A new QP with the number is
// registered on a CQ only once every fence of that number there is over (Shard::FenceForReuse).
// So no completion of a retired QP reaches a later registration, whatever ended it.
//
// Scale: an engine may retire every QP of a CQ at once (10^5 of them at shutdown), so no step
// costs more than the fences it concerns. The fences of one (CQ, qp_num) are found through a hash
// of chains (Take, the per-completion check, walks only its number's chain); an ended fence is
// only marked, and the list is compacted in place once the ended ones outnumber the live, so a
// drop of n fences costs O(n), not O(n^2). A catch-up holds the count of the CQ's polled
// completions at which it is over (CqRecord::fenced.catch_up_polled), so Polled walks the list
// only when the earliest one is due or the CQ was found empty, and DropCq walks it once. Only Add
// and Reserve allocate (control calls); nothing the poll path calls does.
//
// Threading: a FenceList belongs to one shard and is used on its driver; the control path
// changes it only through the shard's control calls. It writes the CQ's counters:
// `awaited_markers` and `catch_ups` (shard-owned, for the hot path's one-branch check), and
// `fences` (atomic, relaxed: the control path reads it to skip the reuse check; a fence added in
// a control call is counted before that call returns). A fence's commitment is given back with a
// release subtraction, which Commit's acquire load pairs with.
#ifndef CQD_RUNTIME_CORE_FENCES_H_
#define CQD_RUNTIME_CORE_FENCES_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include "runtime/core/records.h"

namespace cqd::internal {

struct Fence {
  CqRecord* cq = nullptr;
  uint32_t qp_num = 0;
  uint64_t marker = 0;        // the awaited marker's wr_id; 0: none
  bool unfenced = false;      // no marker stands behind this side: only a catch-up ends it
  uint64_t commit = 0;        // work requests of the CQ's capacity held until the fence ends
  bool catching_up = false;   // a catch-up runs (set by FenceList)
  uint64_t catch_up_end = 0;  // while it runs: the CQ's catch_up_polled at which it is over
  const void* qp = nullptr;   // the retired QP's native object
  bool marker_first = false;  // a catch-up does not end it while its marker is awaited
  bool for_reuse = false;     // RegisterQp's own catch-up of a number retired on the CQ
                              // (retired_numbers.h): no QP, no marker, no commitment
};

class FenceList {
 public:
  // Adds `fence` (its CQ's counters and leftover_commit raised), with a catch-up running if
  // `catch_up`. A fence with nothing to wait for is not added.
  void Add(const Fence& fence, bool catch_up) noexcept;

  // What a completion polled from a CQ with awaited markers is.
  enum class Taken {
    kNotFenced,     // nothing awaits a marker for its qp_num: route it as usual
    kMarker,        // an awaited marker: the runtime's own, dropped (its fence may end)
    kBehindMarker,  // a retired QP's, ahead of its awaited marker: for the orphan sink
  };
  // Call only while cq->fenced.awaited_markers != 0.
  Taken Take(CqRecord* cq, const ibv_wc& wc) noexcept;

  // A poll of `cq` took `n` completions; `empty`: it found the CQ empty. Advances and ends the
  // catch-ups running there. Call only while cq->fenced.catch_ups != 0.
  void Polled(CqRecord* cq, int n, bool empty) noexcept;

  // Starts a catch-up for every fence of `qp_num` on `cq` that has none running.
  void StartCatchUps(CqRecord* cq, uint32_t qp_num) noexcept;

  // `in_error_qp`, in the error state, registers with `qp_num` on `cq` (null: a QP that is not):
  // the fences of that number that stand for that very QP object and await a marker end only by
  // it; every other fence of the number may end by a catch-up (see the header).
  void AwaitMarkers(CqRecord* cq, uint32_t qp_num, const void* in_error_qp) noexcept;

  // Returns true while a fence of `qp_num` on `cq` stands.
  bool Holds(const CqRecord* cq, uint32_t qp_num) const noexcept;
  // Returns true while a for_reuse catch-up of `qp_num` on `cq` runs: one RegisterQp started it,
  // after the QP that had the number was destroyed, so another attempt needs no second one.
  bool HoldsForReuse(const CqRecord* cq, uint32_t qp_num) const noexcept;

  // Ends every fence on `cq` (it is being removed: nothing more comes out of it).
  void DropCq(CqRecord* cq) noexcept;

  // Returns the number of fences standing.
  size_t size() const noexcept { return live_; }
  // Room for `n` fences before Add allocates (the poller reserves some up front).
  void Reserve(size_t n);

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    Fence fence;    // fence.cq == nullptr: ended, awaiting compaction
    uint32_t next;  // the next entry in its bucket's chain; kNone: the last
  };

  // Returns the bucket of (cq, qp_num); heads_ is not empty.
  size_t Bucket(const CqRecord* cq, uint32_t qp_num) const noexcept;
  // Calls fn(index) for each standing entry of (cq, qp_num), newest first, until fn returns
  // false. (Self: FenceList or const FenceList.)
  template <typename Self, typename Fn>
  static void ForEachOf(Self& self, const CqRecord* cq, uint32_t qp_num, Fn&& fn) noexcept;
  // Starts a catch-up for `f`, which has none running.
  static void StartCatchUp(Fence& f) noexcept;
  // Ends entries_[i] (gives its commitment back) and marks it ended.
  void End(size_t i) noexcept;
  // Removes ended entries once they outnumber the standing ones (in place, no allocation).
  void MaybeCompact() noexcept;
  // Drops the ended entries, keeping the order of the rest, and relinks the chains.
  void Compact() noexcept;
  // The same over `buckets` buckets (a power of two; allocates when it grows).
  void Relink(size_t buckets);
  // Removes the ended entries from entries_ (its capacity kept); the chains are then stale.
  void DropEnded() noexcept;
  // Rebuilds every chain from entries_.
  void Link() noexcept;

  std::vector<Entry> entries_;   // in the order added; ended ones until the next compaction
  std::vector<uint32_t> heads_;  // per bucket: the newest entry of its chain; kNone: empty
  size_t live_ = 0;              // entries standing
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_FENCES_H_
