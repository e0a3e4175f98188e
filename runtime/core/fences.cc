// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/fences.h"

#include <algorithm>

namespace cqd::internal {

void FenceList::Add(const Fence& fence, bool catch_up) noexcept {
  if (fence.marker == 0 && !fence.unfenced && !catch_up) return;  // nothing stands behind it
  Fence& f = fences_.emplace_back(fence);
  CqRecord* cq = f.cq;
  if (catch_up) {
    f.catch_up_left = cq->cq->depth();
    ++cq->catch_ups;
  } else {
    f.catch_up_left = -1;
  }
  if (f.marker != 0) ++cq->awaited_markers;
  cq->fences.fetch_add(1, std::memory_order_relaxed);
  cq->leftover_commit.fetch_add(f.commit, std::memory_order_relaxed);
}

FenceList::Taken FenceList::Take(CqRecord* cq, const ibv_wc& wc) noexcept {
  bool awaited = false;
  for (size_t i = 0; i < fences_.size(); ++i) {
    Fence& f = fences_[i];
    if (f.cq != cq || f.marker == 0 || f.qp_num != wc.qp_num) continue;
    if (f.marker != wc.wr_id) {
      awaited = true;  // another side's marker may still match
      continue;
    }
    f.marker = 0;
    --cq->awaited_markers;
    if (!f.unfenced) End(i);
    return Taken::kMarker;
  }
  return awaited ? Taken::kBehindMarker : Taken::kNotFenced;
}

void FenceList::Polled(CqRecord* cq, int n, bool empty) noexcept {
  for (size_t i = 0; i < fences_.size();) {
    Fence& f = fences_[i];
    if (f.cq == cq && f.catch_up_left >= 0) {
      f.catch_up_left = std::max<int64_t>(0, f.catch_up_left - n);  // >= 0: still running
      if (empty || f.catch_up_left <= 0) {
        if (!f.marker_first || f.marker == 0) {
          End(i);
          continue;
        }
        f.catch_up_left = -1;  // over, but only the marker ends this one
        --cq->catch_ups;
      }
    }
    ++i;
  }
}

void FenceList::StartCatchUps(CqRecord* cq, uint32_t qp_num) noexcept {
  for (Fence& f : fences_) {
    if (f.cq != cq || f.qp_num != qp_num || f.catch_up_left >= 0) continue;
    f.catch_up_left = cq->cq->depth();
    ++cq->catch_ups;
  }
}

void FenceList::AwaitMarkers(CqRecord* cq, uint32_t qp_num, const void* in_error_qp) noexcept {
  for (Fence& f : fences_) {
    if (f.cq == cq && f.qp_num == qp_num)
      f.marker_first = in_error_qp != nullptr && f.qp == in_error_qp;
  }
}

bool FenceList::Holds(const CqRecord* cq, uint32_t qp_num) const noexcept {
  for (const Fence& f : fences_) {
    if (f.cq == cq && f.qp_num == qp_num) return true;
  }
  return false;
}

bool FenceList::HoldsForReuse(const CqRecord* cq, uint32_t qp_num) const noexcept {
  for (const Fence& f : fences_) {
    if (f.cq == cq && f.qp_num == qp_num && f.for_reuse) return true;
  }
  return false;
}

void FenceList::DropCq(CqRecord* cq) noexcept {
  for (size_t i = 0; i < fences_.size();) {
    if (fences_[i].cq == cq) {
      End(i);
    } else {
      ++i;
    }
  }
}

void FenceList::End(size_t i) noexcept {
  Fence& f = fences_[i];
  CqRecord* cq = f.cq;
  if (f.marker != 0) --cq->awaited_markers;
  if (f.catch_up_left >= 0) --cq->catch_ups;
  cq->fences.fetch_sub(1, std::memory_order_relaxed);
  cq->leftover_commit.fetch_sub(f.commit, std::memory_order_release);
  fences_.erase(fences_.begin() + static_cast<std::ptrdiff_t>(i));
}

}  // namespace cqd::internal
