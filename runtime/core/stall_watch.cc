// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/stall_watch.h"

#include <cstdio>
#include <string>

namespace cqd::internal {

StallWatch::StallWatch(const Logger& log, const std::vector<std::unique_ptr<Poller>>& pollers,
                       const std::vector<std::unique_ptr<Consumer>>& consumers)
    : log_(log), pollers_(pollers), consumers_(consumers), watched_(consumers.size()) {}

void StallWatch::Tick() {
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < consumers_.size(); ++i) {
    const Consumer& consumer = *consumers_[i];
    ConsumerStats stats;
    for (const auto& poller : pollers_) poller->AddSpillStats(consumer.index(), stats);
    Watched& w = watched_[i];
    const bool new_stall = stats.stalls != w.last_stalls;
    w.last_stalls = stats.stalls;
    if (w.reported && (stats.stall_ns == 0 || new_stall)) {
      log_.Info("consumer " + std::to_string(i) + " (" + consumer.name() +
                ") drains again: its pollers are no longer held back");
      w.reported = false;
    }
    if (stats.stall_ns == 0 || w.reported) continue;
    if (stats.stall_ns < static_cast<uint64_t>(std::chrono::nanoseconds(kReportAfter).count())) {
      continue;
    }
    if (w.last_warning != std::chrono::steady_clock::time_point{} &&
        now - w.last_warning < kQuietFor) {
      if (new_stall) ++w.unreported;
      continue;
    }
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", static_cast<double>(stats.stall_ns) / 1e9);
    std::string line = "consumer " + std::to_string(i) + " (" + consumer.name() +
                       ") has held its pollers back for " + seconds + " s: its queue holds " +
                       std::to_string(consumer.depth()) + " items and the spills " +
                       std::to_string(stats.spill_depth) +
                       "; its handlers are not returning, or its engine thread is not calling "
                       "Drain (CQs it shares wait in the CQ meanwhile)";
    if (w.unreported > 0) {
      line += " (" + std::to_string(w.unreported) + " shorter stalls since the last warning)";
    }
    log_.Warning(line);
    w.reported = true;
    w.unreported = 0;
    w.last_warning = now;
  }
}

}  // namespace cqd::internal
