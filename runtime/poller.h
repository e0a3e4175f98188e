// runtime/poller.h: one poller thread, owning one CQ shard.
//
// The poller batch-polls its CQs round robin (at most poll_batch per CQ per pass, so one busy CQ
// cannot starve the others), routes each completion by qp_num through its device's QpTable, stages
// it per destination consumer and hands each consumer its slice with one bulk enqueue. When a
// consumer is full it keeps the slice and stops polling until there is room (backpressure: the
// completions stay in the CQ, none is dropped).
//
// Idle: after `idle_budget` without completions it arms every CQ not already armed (S7), polls
// once more (S6) and sleeps only if that found nothing. The event thread clears `armed` and calls
// Wake() for each event; Parker orders the sleep against the wake.
//
// Threading: the CQ list and staging buffers belong to the poller thread. Other threads change
// the CQ list only through RunSync, which runs a function on the poller thread at the top of its
// loop (or inline once the thread has stopped) and waits for it.
#ifndef CQD_RUNTIME_POLLER_H_
#define CQD_RUNTIME_POLLER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cqd/options.h"
#include "cqd/stats.h"
#include "runtime/consumer.h"
#include "runtime/mailbox.h"
#include "runtime/orphans.h"
#include "runtime/parker.h"
#include "runtime/records.h"
#include "runtime/registry.h"

namespace cqd::internal {

class Poller {
 public:
  Poller(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
         const SlotPool& slots, OrphanSink& orphans);
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  void Start();
  // Stops polling, hands everything already polled to the consumers, and joins.
  void Stop();
  // Runs `fn` on the poller thread between two passes and waits for it.
  void RunSync(const std::function<void(std::vector<CqRecord*>&)>& fn);
  // Event thread: a CQ of this shard got an event.
  void Wake() noexcept { parker_.Wake(); }
  PollerStats stats() const;
  int index() const { return index_; }

 private:
  struct Stage {
    std::unique_ptr<Item[]> items;
    uint32_t count = 0;
  };
  void Run();
  // Polls every CQ once; returns the number of completions taken.
  int PollAll() noexcept;
  void Route(CqRecord* cq, int n) noexcept;
  // Hands staged slices to their consumers; returns false if one was full (it stays staged).
  bool Flush(bool force) noexcept;
  void TrySleep() noexcept;
  void Backoff(uint32_t stalls) noexcept;
  void Count(std::atomic<uint64_t>& counter, uint64_t n) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  const int index_;
  const RuntimeOptions& options_;
  std::vector<Consumer*> consumers_;
  const SlotPool& slots_;
  OrphanSink& orphans_;
  std::vector<CqRecord*> cqs_;
  std::vector<moodycamel::ProducerToken> tokens_;  // one per consumer
  std::vector<Stage> stages_;                      // one per consumer
  std::vector<uint32_t> touched_;                  // consumers with a staged slice
  std::unique_ptr<ibv_wc[]> wcs_;
  bool staged_ = false;  // a slice is waiting for room

  std::thread thread_;
  std::atomic<bool> stop_{false};
  Parker parker_;
  Mailbox mailbox_;

  // Stats, written by the poller thread only.
  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> empty_polls_{0};
  std::atomic<uint64_t> completions_{0};
  std::atomic<uint64_t> arms_{0};
  std::atomic<uint64_t> sleeps_{0};
  std::atomic<uint64_t> stalls_{0};
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_POLLER_H_
