#include "runtime/registry.h"

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
    : capacity_(capacity), slots_(std::make_unique<Slot[]>(capacity)) {
  for (uint32_t i = 0; i < capacity; ++i) free_.push_back(i);
}

int64_t SlotPool::Allocate() {
  if (free_.empty()) return -1;
  uint32_t index = free_.front();
  free_.pop_front();
  return index;
}

void SlotPool::Free(uint32_t index) { free_.push_back(index); }

}  // namespace cqd::internal
