// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/stall_watch.h: says in the log when a consumer holds its pollers back.
//
// A consumer whose queue and spills are full holds back every poller with entries for it (the
// stall, ConsumerStats::stall_ns). The pollers cannot log (the data path never does), so the
// event thread looks once a second (EventLoop's tick, only while a log sink is set): a stall
// that has lasted kReportAfter is logged once as a warning, naming the consumer, how long, and
// its queue's fill; its end (no poller held back any more) is logged once at info. A consumer
// whose stalls come and go is warned about at most once per kQuietFor: the stalls begun in
// between are counted in the next warning.
//
// Threading: Tick runs on the event thread only; it reads the shards' spill counters as GetStats
// does (AddSpillStats: relaxed loads, stalled_ns with acquire, a fetch-max CAS on
// stalled_ns_reported).
#ifndef CQD_RUNTIME_CORE_STALL_WATCH_H_
#define CQD_RUNTIME_CORE_STALL_WATCH_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/core/consumer.h"
#include "runtime/core/shard/shard.h"

namespace cqd::internal {

class StallWatch {
 public:
  static constexpr std::chrono::seconds kReportAfter{1};
  static constexpr std::chrono::seconds kQuietFor{10};

  StallWatch(const Logger& log, const std::vector<std::unique_ptr<Shard>>& pollers,
             const std::vector<std::unique_ptr<Consumer>>& consumers);

  // Looks at every consumer's stall and logs what changed (event thread, once a second).
  void Tick();

 private:
  struct Watched {
    bool reported = false;       // the stall in progress was warned about
    uint64_t since_warning = 0;  // stalls begun (on any poller) since the last warning
    uint64_t last_stalls = 0;    // ConsumerStats::stalls at the last look
    std::chrono::steady_clock::time_point last_warning{};
  };

  const Logger& log_;
  const std::vector<std::unique_ptr<Shard>>& pollers_;
  const std::vector<std::unique_ptr<Consumer>>& consumers_;
  std::vector<Watched> watched_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_STALL_WATCH_H_
