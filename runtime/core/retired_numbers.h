// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/retired_numbers.h: the qp_nums whose registration ended on one CQ and that have
// not been registered there since.
//
// A QP may still complete work after its registration ended: a receive that lands between a
// plain Unregister and the engine's ibv_destroy_qp, a flush of a work request posted to a
// torn-down QP. Those completions wait in the CQ after every fence of the number is over. A
// device hands a number out again only once the QP that had it is destroyed, so when the number
// registers on the CQ again, every completion the old QP will ever have is in the CQ (or was
// cleaned out of it): RegisterQp then polls the CQ out first (a catch-up, fences.h), and none of
// them reaches the new registration. This set says which numbers need that.
//
// One bit per number, in pages of 4096 numbers (512 bytes) made on first use and freed when
// their last number leaves: at most 2 MiB per CQ over the whole 24-bit space. If a page cannot be
// made (out of memory), every number counts as retired from then on (each RegisterQp on the CQ
// polls it out first), which costs time, never the guarantee.
//
// Threading: the control path only, under the runtime's mutex. Never blocks; allocates in Add.
#ifndef CQD_RUNTIME_CORE_RETIRED_NUMBERS_H_
#define CQD_RUNTIME_CORE_RETIRED_NUMBERS_H_

#include <cstdint>
#include <memory>
#include <new>
#include <unordered_map>

namespace cqd::internal {

class RetiredNumbers {
 public:
  // Records `qp_num` (at most 24 bits) as retired.
  void Add(uint32_t qp_num) noexcept {
    try {
      auto it = pages_.find(qp_num >> kPageShift);
      if (it == pages_.end())
        it = pages_.emplace(qp_num >> kPageShift, std::make_unique<Page>()).first;
      Page* page = it->second.get();
      uint64_t& word = page->bits[(qp_num & kPageMask) >> 6];
      const uint64_t bit = uint64_t{1} << (qp_num & 63);
      if ((word & bit) == 0) {
        word |= bit;
        ++page->count;
        ++size_;
      }
    } catch (const std::bad_alloc&) {
      all_ = true;
    }
  }
  // Returns true if `qp_num` was retired and has not been removed since (always, after an Add
  // ran out of memory).
  bool Contains(uint32_t qp_num) const noexcept {
    if (all_) return true;
    const auto it = pages_.find(qp_num >> kPageShift);
    if (it == pages_.end()) return false;
    return (it->second->bits[(qp_num & kPageMask) >> 6] >> (qp_num & 63)) & 1;
  }
  // The number has registered on the CQ again: forgets it.
  void Remove(uint32_t qp_num) noexcept {
    const auto it = pages_.find(qp_num >> kPageShift);
    if (it == pages_.end()) return;
    uint64_t& word = it->second->bits[(qp_num & kPageMask) >> 6];
    const uint64_t bit = uint64_t{1} << (qp_num & 63);
    if ((word & bit) == 0) return;
    word &= ~bit;
    --size_;
    if (--it->second->count == 0) pages_.erase(it);
  }
  // Returns how many numbers are recorded (not counting an out-of-memory "all").
  uint64_t size() const noexcept { return size_; }
  // Returns how many pages are allocated.
  size_t pages() const noexcept { return pages_.size(); }

 private:
  static constexpr int kPageShift = 12;
  static constexpr uint32_t kPageMask = (1u << kPageShift) - 1;
  struct Page {
    uint32_t count = 0;  // bits set
    uint64_t bits[(1u << kPageShift) / 64] = {};
  };
  std::unordered_map<uint32_t, std::unique_ptr<Page>> pages_;
  uint64_t size_ = 0;
  bool all_ = false;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_RETIRED_NUMBERS_H_
