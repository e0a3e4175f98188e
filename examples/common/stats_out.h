// SPDX-License-Identifier: BSD-2-Clause
// examples/common/stats_out.h: how the examples report the runtime's counters at exit.
#ifndef CQD_EXAMPLES_COMMON_STATS_OUT_H_
#define CQD_EXAMPLES_COMMON_STATS_OUT_H_

#include <cinttypes>
#include <cstdio>
#include <string>

#include "cqd/runtime.h"
#include "cqd/stats_format.h"

namespace cqd::examples {

// Prints a one-line digest of the runtime's stats and, with a path, writes them there as JSON
// ("-": to stdout).
inline void WriteStats(Runtime& rt, const std::string& path) {
  Stats stats = rt.GetStats();
  uint64_t completions = 0;
  for (const PollerStats& p : stats.pollers) completions += p.completions;
  printf("stats: completions=%" PRIu64 " cm_events=%" PRIu64 " orphans=%" PRIu64 "\n", completions,
         stats.cm_events, stats.orphans);
  if (path.empty()) return;
  const std::string json = StatsToJson(stats);
  if (path == "-") {
    printf("%s\n", json.c_str());
    return;
  }
  FILE* out = fopen(path.c_str(), "w");
  if (out == nullptr) {
    perror(path.c_str());
    return;
  }
  fprintf(out, "%s\n", json.c_str());
  fclose(out);
}

}  // namespace cqd::examples

#endif  // CQD_EXAMPLES_COMMON_STATS_OUT_H_
