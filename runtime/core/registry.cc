// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/registry.h"

#include <algorithm>
#include <new>

namespace cqd::internal {

QpTable::~QpTable() {
  for (auto& page : pages_) delete page.load(std::memory_order_relaxed);
}

void QpTable::Set(uint32_t qp_num, Slot* slot) {
  auto& page_ref = pages_[(qp_num >> kPageBits) & (kPageSize - 1)];
  Page* page = page_ref.load(std::memory_order_relaxed);
  if (page == nullptr) {
    page = new Page();
    page_ref.store(page, std::memory_order_release);
  }
  page->entries[qp_num & (kPageSize - 1)].store(slot, std::memory_order_release);
}

void QpTable::Clear(uint32_t qp_num) {
  Page* page = pages_[(qp_num >> kPageBits) & (kPageSize - 1)].load(std::memory_order_relaxed);
  if (page != nullptr) {
    page->entries[qp_num & (kPageSize - 1)].store(nullptr, std::memory_order_release);
  }
}

SlotPool::SlotPool(uint32_t capacity)
    : capacity_(capacity),
      chunks_(std::make_unique<std::atomic<Slot*>[]>((capacity + kChunkSize - 1) / kChunkSize)) {}

SlotPool::~SlotPool() {
  for (uint32_t c = 0; c < (capacity_ + kChunkSize - 1) / kChunkSize; ++c) {
    delete[] chunks_[c].load(std::memory_order_relaxed);
  }
}

int64_t SlotPool::Allocate() noexcept {
  // Reuse freed slots once a few have gathered (or nothing fresh is left); grow otherwise.
  constexpr size_t kReuseAfter = 64;
  if (!free_.empty() && (free_.size() >= kReuseAfter || next_fresh_ == capacity_)) {
    uint32_t index = free_.front();
    free_.pop_front();
    return index;
  }
  if (next_fresh_ == capacity_) return -1;
  if (next_fresh_ == allocated_.load(std::memory_order_relaxed)) {
    Slot* chunk = new (std::nothrow) Slot[kChunkSize];
    if (chunk == nullptr) return -2;
    for (uint32_t i = 0; i < kChunkSize; ++i) chunk[i].index = next_fresh_ + i;
    chunks_[next_fresh_ >> kChunkBits].store(chunk, std::memory_order_release);
    allocated_.store(std::min(capacity_, next_fresh_ + kChunkSize), std::memory_order_release);
  }
  return next_fresh_++;
}

void SlotPool::Free(uint32_t index) { free_.push_back(index); }

}  // namespace cqd::internal
