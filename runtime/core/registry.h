// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/registry.h: QP registrations and the qp_num -> registration lookup.
//
// A Slot holds one registration. Slots live in chunks of 4096 that are allocated the first time a
// registration needs one and kept for the runtime's lifetime; slots are recycled, never freed,
// so a poller or consumer holding a stale slot index reads valid memory; the generation in
// Slot::state tells a stale item from a live one. Slot fields are atomics:
// control writes them with relaxed stores and publishes with a release store of `state`; readers
// load `state` with acquire first.
//
// QpTable maps a device's 24-bit qp_num to its Slot in two dependent loads (4096 pages of 4096
// entries, pages allocated on first use and kept). Lookup is lock-free and may run on any thread;
// Set/Clear run on the control path, under the runtime's mutex.
#ifndef CQD_RUNTIME_CORE_REGISTRY_H_
#define CQD_RUNTIME_CORE_REGISTRY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>

#include "cqd/handler.h"
#include "runtime/base/check.h"

namespace cqd::internal {

struct TeardownState;

// state = generation << 32 | consumer << 2 | tearing_down << 1 | live. `tearing_down`: a TeardownQp
// is under way; pollers then look for its marker completions (teardown.h). Written by the control
// path alone; read for routing only (route.h decodes it).
inline constexpr uint64_t MakeState(uint32_t generation, uint32_t consumer, bool live,
                                    bool tearing_down = false) {
  return uint64_t{generation} << 32 | uint64_t{consumer & 0x3fffffff} << 2 |
         (tearing_down ? 2 : 0) | (live ? 1 : 0);
}
struct alignas(64) Slot {
  std::atomic<uint64_t> state{0};
  uint32_t index = 0;  // this slot's index in its SlotPool; set once, before it is published
  std::atomic<QpHandler*> handler{nullptr};
  std::atomic<uint32_t> qp_num{0};
  std::atomic<uint32_t> device{0};
  std::atomic<uint32_t> send_cq{0};
  std::atomic<uint32_t> recv_cq{0};
  std::atomic<uint16_t> send_shard{0};
  std::atomic<uint16_t> recv_shard{0};
  std::atomic<void*> qp{nullptr};                 // the native QP (ibv_qp* or SimQp*), for teardown
  std::atomic<TeardownState*> teardown{nullptr};  // while tearing down; published by `state`
  // Bumped (never to 0) by each TeardownQp attempt before it sets `tearing_down`; published by
  // `state`. Tells a LAST_WQE_REACHED posted during this attempt from one of an earlier attempt.
  std::atomic<uint32_t> teardown_epoch{0};
  // The control path's own: read and written under the runtime mutex only, never by routing.
  // What it last published in `state` (it alone writes that word, through Publish), so that it
  // never decodes the word routing reads; and the work requests committed on each CQ.
  struct Control {
    uint32_t generation = 0;
    uint32_t consumer = 0;
    bool live = false;
    bool tearing_down = false;
    uint32_t send_commit = 0;
    uint32_t recv_commit = 0;
    // Returns true if the registration is live with `g` (the one a handle names).
    bool LiveAs(uint32_t g) const noexcept { return live && generation == g; }
  };
  Control control;

  // Control path (under the runtime mutex): makes `control` say (generation, consumer, live,
  // tearing_down) and publishes that in `state` with `order`.
  void Publish(uint32_t generation, uint32_t consumer, bool live, bool tearing_down,
               std::memory_order order) noexcept {
    control.generation = generation;
    control.consumer = consumer;
    control.live = live;
    control.tearing_down = tearing_down;
    state.store(MakeState(generation, consumer, live, tearing_down), order);
  }

  // After an acquire load of `state`: true if the slot still holds (device, qp_num). A reader
  // that looked the slot up may have been overtaken by an unregister and a new registration
  // reusing it; this tells it so.
  bool Holds(uint32_t dev, uint32_t qp) const noexcept {
    return qp_num.load(std::memory_order_relaxed) == qp &&
           device.load(std::memory_order_relaxed) == dev;
  }
  // After an acquire load of `state`: true if the registration uses CQ `cq_id`. A completion on
  // another CQ is a leftover of an earlier QP that had this qp_num (devices reuse numbers).
  bool Uses(uint32_t cq_id) const noexcept {
    return send_cq.load(std::memory_order_relaxed) == cq_id ||
           recv_cq.load(std::memory_order_relaxed) == cq_id;
  }
};

class QpTable {
 public:
  static constexpr uint32_t kPageBits = 12;
  static constexpr uint32_t kPageSize = 1u << kPageBits;

  QpTable() = default;
  QpTable(const QpTable&) = delete;
  QpTable& operator=(const QpTable&) = delete;
  ~QpTable();

  // Returns the slot registered for qp_num, or nullptr. Lock-free; two dependent loads.
  Slot* Lookup(uint32_t qp_num) const noexcept {
    Page* page = pages_[(qp_num >> kPageBits) & (kPageSize - 1)].load(std::memory_order_acquire);
    if (page == nullptr) return nullptr;
    return page->entries[qp_num & (kPageSize - 1)].load(std::memory_order_acquire);
  }
  // Control path.
  void Set(uint32_t qp_num, Slot* slot);
  void Clear(uint32_t qp_num);

 private:
  struct Page {
    std::array<std::atomic<Slot*>, kPageSize> entries{};
  };
  std::array<std::atomic<Page*>, kPageSize> pages_{};
};

// The slots and their free list. Control path only (under the runtime's mutex), except slot()
// and allocated(), which any thread may call: slot() for an index it got from an item or a table.
class SlotPool {
 public:
  static constexpr uint32_t kChunkBits = 12;
  static constexpr uint32_t kChunkSize = 1u << kChunkBits;

  explicit SlotPool(uint32_t capacity);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Returns a free slot index, -1 when all `capacity` are in use, or -2 when memory for a new
  // chunk could not be had. Freed slots are reused first-in first-out once enough have gathered,
  // so a just-freed slot is not handed out again soon.
  int64_t Allocate() noexcept;
  void Free(uint32_t index);
  // Requires index < allocated() (kNoSlot names no slot: see RouteEntryAtConsumer).
  Slot& slot(uint32_t index) const noexcept {
    CQD_DCHECK(index < allocated(), "a slot index past the pool (kNoSlot?)");
    return chunks_[index >> kChunkBits].load(std::memory_order_acquire)[index & (kChunkSize - 1)];
  }
  // Returns how many slots exist (indexes below it are valid); grows, never shrinks.
  uint32_t allocated() const noexcept { return allocated_.load(std::memory_order_acquire); }
  uint32_t capacity() const { return capacity_; }

 private:
  const uint32_t capacity_;
  std::unique_ptr<std::atomic<Slot*>[]> chunks_;
  std::atomic<uint32_t> allocated_{0};  // slots in allocated chunks
  uint32_t next_fresh_ = 0;             // next never-used index
  std::deque<uint32_t> free_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_REGISTRY_H_
