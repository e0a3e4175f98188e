// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/stall_watch.h"

#include <cstdio>
#include <string>

namespace cqd::internal {

StallWatch::StallWatch(const Logger& log, const std::vector<std::unique_ptr<Shard>>& pollers,
                       const std::vector<std::unique_ptr<Consumer>>& consumers)
    : log_(log), pollers_(pollers), consumers_(consumers), watched_(consumers.size()) {}

void StallWatch::Tick() {
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < consumers_.size(); ++i) {
    const Consumer& consumer = *consumers_[i];
    ConsumerStats stats;
    for (const auto& poller : pollers_) poller->AddSpillStats(consumer.index(), stats);
    Watched& w = watched_[i];
    // Stalls begun since the last look, on any of the consumer's pollers.
    w.since_warning += stats.stalls - w.last_stalls;
    w.last_stalls = stats.stalls;
    if (stats.stall_ns == 0) {  // no poller is held back for it now
      if (w.reported) {
        log_.Info("consumer " + std::to_string(i) + " (" + consumer.name() +
                  ") drains again: its pollers are no longer held back");
        w.reported = false;
      }
      continue;
    }
    // A stall in progress (stall_ns counts from the oldest one of its pollers).
    if (w.reported) continue;
    if (stats.stall_ns < static_cast<uint64_t>(std::chrono::nanoseconds(kReportAfter).count())) {
      continue;
    }
    if (w.last_warning != std::chrono::steady_clock::time_point{} &&
        now - w.last_warning < kQuietFor) {
      continue;  // warned a moment ago: the next warning says how many came since
    }
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", static_cast<double>(stats.stall_ns) / 1e9);
    std::string line = "consumer " + std::to_string(i) + " (" + consumer.name() +
                       ") has held its pollers back for " + seconds + " s: its queue holds " +
                       std::to_string(consumer.depth()) + " items and the spills " +
                       std::to_string(stats.spill_depth) +
                       "; its handlers are not returning, or its engine thread is not calling "
                       "Drain (CQs it shares wait in the CQ meanwhile)";
    if (w.last_warning != std::chrono::steady_clock::time_point{} && w.since_warning > 1) {
      line += " (" + std::to_string(w.since_warning - 1) +
              " more stalls began since the last "
              "warning)";
    }
    log_.Warning(line);
    w.reported = true;
    w.since_warning = 0;
    w.last_warning = now;
  }
}

}  // namespace cqd::internal
