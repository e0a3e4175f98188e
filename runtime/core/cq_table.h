// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/cq_table.h: the CQs a runtime polls, by id and by native CQ, the adopted ones it
// released (still acked and counted should an event come), and the event counters of those
// destroyed.
//
// Threading: control path only; every call requires the runtime's mutex (ControlCore::mu). The
// records' atomics are read with the orders CqRecord documents (acked_events with acquire, before
// events).
#ifndef CQD_RUNTIME_CORE_CQ_TABLE_H_
#define CQD_RUNTIME_CORE_CQ_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cqd/stats.h"
#include "runtime/core/records.h"

namespace cqd::internal {

class CqTable {
 public:
  // Gives `record` the next id and keeps it, mapped by its native CQ (record->native, set);
  // returns it.
  CqRecord* Add(std::unique_ptr<CqRecord> record);
  // Return the CQ with this id, or with this native CQ, or nullptr.
  CqRecord* Find(uint32_t id) const;
  CqRecord* FindNative(void* native) const;
  // Forgets the destroyed CQ `id`, keeping its event counters in the totals.
  void Erase(uint32_t id);
  // Forgets the adopted CQ `id` the engine got back: it stays counted, and a late event of it is
  // still acked, until the runtime goes.
  void Release(uint32_t id);
  // Adds a CqStats per live CQ and the event totals over every CQ, destroyed and released too.
  void FillStats(Stats& stats) const;

  // Runtime destruction: every live CQ, by id, and every released one.
  const std::map<uint32_t, std::unique_ptr<CqRecord>>& live() const { return live_; }
  const std::vector<std::unique_ptr<CqRecord>>& released() const { return released_; }

 private:
  std::map<uint32_t, std::unique_ptr<CqRecord>> live_;  // by id
  std::unordered_map<void*, CqRecord*> by_native_;
  std::vector<std::unique_ptr<CqRecord>> released_;
  uint32_t next_id_ = 1;
  // Event counters of destroyed CQs.
  uint64_t gone_events_ = 0;
  uint64_t gone_acked_ = 0;
  uint64_t gone_ack_calls_ = 0;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CQ_TABLE_H_
