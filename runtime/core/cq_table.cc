// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/cq_table.h"

namespace cqd::internal {

CqRecord* CqTable::Add(std::unique_ptr<CqRecord> record) {
  CqRecord* cq = record.get();
  cq->id = next_id_++;
  by_native_[cq->native] = cq;
  live_[cq->id] = std::move(record);
  return cq;
}

CqRecord* CqTable::Find(uint32_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second.get();
}

CqRecord* CqTable::FindNative(void* native) const {
  auto it = by_native_.find(native);
  return it == by_native_.end() ? nullptr : it->second;
}

void CqTable::Erase(uint32_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  const CqRecord& cq = *it->second;
  gone_events_ += cq.counts.events.load(std::memory_order_relaxed);
  gone_acked_ += cq.counts.acked_events.load(std::memory_order_relaxed);
  gone_ack_calls_ += cq.counts.ack_calls.load(std::memory_order_relaxed);
  by_native_.erase(cq.native);
  live_.erase(it);
}

void CqTable::Release(uint32_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  by_native_.erase(it->second->native);
  released_.push_back(std::move(it->second));
  live_.erase(it);
}

void CqTable::FillStats(Stats& stats) const {
  for (const auto& [id, cq] : live_) {
    CqStats c;
    c.id = id;
    c.shard = cq->shard;
    c.comp_vector = cq->comp_vector;
    c.completions = cq->counts.completions.load(std::memory_order_relaxed);
    // Acked first (acquire, see CqRecord::Ack): an event is counted before it is acked, so the
    // snapshot never shows more acked than read.
    c.acked_events = cq->counts.acked_events.load(std::memory_order_acquire);
    c.events = cq->counts.events.load(std::memory_order_relaxed);
    c.ack_calls = cq->counts.ack_calls.load(std::memory_order_relaxed);
    c.poll_errors = cq->counts.poll_errors.load(std::memory_order_relaxed);
    stats.cqs.push_back(c);
    stats.cq_events += c.events;
    stats.cq_acked_events += c.acked_events;
    stats.cq_ack_calls += c.ack_calls;
  }
  for (const auto& cq : released_) {  // adopted, released, still acked if an event comes
    stats.cq_acked_events +=
        cq->counts.acked_events.load(std::memory_order_acquire);  // first, as above
    stats.cq_events += cq->counts.events.load(std::memory_order_relaxed);
    stats.cq_ack_calls += cq->counts.ack_calls.load(std::memory_order_relaxed);
  }
  stats.cq_events += gone_events_;
  stats.cq_acked_events += gone_acked_;
  stats.cq_ack_calls += gone_ack_calls_;
}

}  // namespace cqd::internal
