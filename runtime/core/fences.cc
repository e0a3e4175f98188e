// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/fences.h"

#include <algorithm>
#include <bit>

namespace cqd::internal {

size_t FenceList::Bucket(const CqRecord* cq, uint32_t qp_num) const noexcept {
  uint64_t h = (reinterpret_cast<uintptr_t>(cq) >> 4) * 0x9e3779b97f4a7c15ull;
  h ^= static_cast<uint64_t>(qp_num) * 0xc2b2ae3d27d4eb4full;
  return static_cast<size_t>(h ^ (h >> 29)) & (heads_.size() - 1);
}

template <typename Self, typename Fn>
void FenceList::ForEachOf(Self& self, const CqRecord* cq, uint32_t qp_num, Fn&& fn) noexcept {
  if (self.heads_.empty()) return;
  for (uint32_t i = self.heads_[self.Bucket(cq, qp_num)]; i != kNone; i = self.entries_[i].next) {
    const Fence& f = self.entries_[i].fence;
    if (f.cq == cq && f.qp_num == qp_num && !fn(i)) return;
  }
}

void FenceList::Add(const Fence& fence, bool catch_up) noexcept {
  if (fence.marker == 0 && !fence.unfenced && !catch_up) return;  // nothing stands behind it
  if (entries_.size() + 1 > heads_.size() / 2) {
    // Out of room: compact when a quarter or more has ended, else grow (which compacts too), so
    // that a list kept near the edge does not compact on every Add.
    if (4 * (entries_.size() - live_) >= entries_.size()) Compact();
    if (entries_.size() + 1 > heads_.size() / 2) Relink(std::max<size_t>(64, heads_.size() * 2));
  }
  const auto index = static_cast<uint32_t>(entries_.size());
  size_t bucket = Bucket(fence.cq, fence.qp_num);
  Entry& e = entries_.emplace_back(Entry{fence, heads_[bucket]});
  heads_[bucket] = index;
  ++live_;
  Fence& f = e.fence;
  CqRecord* cq = f.cq;
  f.catching_up = false;
  if (catch_up) StartCatchUp(f);
  if (f.marker != 0) ++cq->fenced.awaited_markers;
  cq->fences.fetch_add(1, std::memory_order_relaxed);
  cq->leftover_commit.fetch_add(f.commit, std::memory_order_relaxed);
}

// Newest first, along the chain. Only one standing fence can await a given marker (a marker is
// its teardown's address, +1 for the receive side, and a number is registered on a CQ again only
// once its fences there ended), so the order changes no verdict.
FenceList::Taken FenceList::Take(CqRecord* cq, const ibv_wc& wc) noexcept {
  Taken taken = Taken::kNotFenced;
  ForEachOf(*this, cq, wc.qp_num, [&](uint32_t i) {
    Fence& f = entries_[i].fence;
    if (f.marker == 0) return true;
    if (f.marker != wc.wr_id) {
      taken = Taken::kBehindMarker;  // another side's marker may still match
      return true;
    }
    f.marker = 0;
    --cq->fenced.awaited_markers;
    if (!f.unfenced) End(i);
    taken = Taken::kMarker;
    return false;
  });
  if (taken == Taken::kMarker) MaybeCompact();
  return taken;
}

void FenceList::Polled(CqRecord* cq, int n, bool empty) noexcept {
  cq->fenced.catch_up_polled += static_cast<uint64_t>(n);
  if (!empty && cq->fenced.catch_up_polled < cq->fenced.catch_up_due) return;  // none is over yet
  uint64_t due = UINT64_MAX;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Fence& f = entries_[i].fence;
    if (f.cq != cq || !f.catching_up) continue;
    if (!empty && f.catch_up_end > cq->fenced.catch_up_polled) {
      due = std::min(due, f.catch_up_end);
    } else if (!f.marker_first || f.marker == 0) {
      End(i);
    } else {
      f.catching_up = false;  // over, but only the marker ends this one
      --cq->fenced.catch_ups;
    }
  }
  cq->fenced.catch_up_due = due;
  MaybeCompact();
}

void FenceList::StartCatchUp(Fence& f) noexcept {
  CqRecord* cq = f.cq;
  f.catching_up = true;
  f.catch_up_end = cq->fenced.catch_up_polled + static_cast<uint64_t>(cq->cq->depth());
  cq->fenced.catch_up_due = std::min(cq->fenced.catch_up_due, f.catch_up_end);
  ++cq->fenced.catch_ups;
}

void FenceList::StartCatchUps(CqRecord* cq, uint32_t qp_num) noexcept {
  ForEachOf(*this, cq, qp_num, [&](uint32_t i) {
    Fence& f = entries_[i].fence;
    if (!f.catching_up) StartCatchUp(f);
    return true;
  });
}

void FenceList::AwaitMarkers(CqRecord* cq, uint32_t qp_num, const void* in_error_qp) noexcept {
  ForEachOf(*this, cq, qp_num, [&](uint32_t i) {
    Fence& f = entries_[i].fence;
    f.marker_first = in_error_qp != nullptr && f.qp == in_error_qp;
    return true;
  });
}

bool FenceList::Holds(const CqRecord* cq, uint32_t qp_num) const noexcept {
  bool held = false;
  ForEachOf(*this, cq, qp_num, [&](uint32_t) {
    held = true;
    return false;
  });
  return held;
}

bool FenceList::HoldsForReuse(const CqRecord* cq, uint32_t qp_num) const noexcept {
  bool held = false;
  ForEachOf(*this, cq, qp_num, [&](uint32_t i) {
    held = entries_[i].fence.for_reuse;
    return !held;
  });
  return held;
}

void FenceList::DropCq(CqRecord* cq) noexcept {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].fence.cq == cq) End(i);
  }
  MaybeCompact();
}

void FenceList::Reserve(size_t n) {
  entries_.reserve(n);
  if (heads_.size() < 2 * n) Relink(std::bit_ceil(std::max<size_t>(64, 2 * n)));
}

void FenceList::End(size_t i) noexcept {
  Fence& f = entries_[i].fence;
  CqRecord* cq = f.cq;
  if (f.marker != 0) --cq->fenced.awaited_markers;
  if (f.catching_up) --cq->fenced.catch_ups;
  cq->fences.fetch_sub(1, std::memory_order_relaxed);
  cq->leftover_commit.fetch_sub(f.commit, std::memory_order_release);
  f.cq = nullptr;
  --live_;
}

void FenceList::MaybeCompact() noexcept {
  size_t ended = entries_.size() - live_;
  if (ended > live_ && ended >= 16) Compact();
}

void FenceList::Compact() noexcept {
  if (entries_.size() == live_) return;
  DropEnded();
  Link();
}

void FenceList::Relink(size_t buckets) {
  heads_.assign(buckets, kNone);
  DropEnded();
  Link();
}

void FenceList::DropEnded() noexcept {
  auto ended = std::remove_if(entries_.begin(), entries_.end(),
                              [](const Entry& e) { return e.fence.cq == nullptr; });
  entries_.erase(ended, entries_.end());  // shrinks: no allocation
}

void FenceList::Link() noexcept {
  std::fill(heads_.begin(), heads_.end(), kNone);
  for (size_t i = 0; i < entries_.size(); ++i) {
    size_t bucket = Bucket(entries_[i].fence.cq, entries_[i].fence.qp_num);
    entries_[i].next = heads_[bucket];
    heads_[bucket] = static_cast<uint32_t>(i);
  }
}

}  // namespace cqd::internal
