// SPDX-License-Identifier: BSD-2-Clause
// benchmarks/machine.h: what the harness records about where it ran, and the CPU time threads
// used.
//
// ThreadCpu() reads every thread of this process from /proc/self/task (name and nanoseconds on
// CPU, from schedstat), so a figure "CPU per completion" sums all threads: the poller, the
// consumers, and anything else that ran. TopologyJson() describes the machine: CPU model, online
// CPUs with their core and package, NUMA nodes, caches, kernel and whether it is a guest.
// CrossCoreRoundTripNs() tells which cross-core mode the machine is in at that moment: the small
// VMs these runs use switch every few minutes between a fast and a slow mode (a line moving
// between the two CPUs costs several times more in the slow one), so the dispatch harness records
// the probe beside every throughput, latency and open-loop row and the summaries report each mode
// apart. Call it from one thread at a time, with nothing else pinned to CPUs 0 and 1 running.
#ifndef CQD_BENCHMARKS_MACHINE_H_
#define CQD_BENCHMARKS_MACHINE_H_

#include <cstdint>
#include <map>
#include <string>

namespace cqd::bench {

// Thread name -> nanoseconds on CPU so far; threads sharing a name are summed.
std::map<std::string, uint64_t> ThreadCpu();
// The CPU time of the whole process so far, in nanoseconds (every thread, live or joined).
uint64_t ProcessCpuNs();
// `after - before`, per name (names only in `after` count from zero).
std::map<std::string, uint64_t> CpuDelta(const std::map<std::string, uint64_t>& before,
                                         const std::map<std::string, uint64_t>& after);
// A JSON object describing this machine.
std::string TopologyJson();
// Names the calling thread (at most 15 characters are kept).
void NameThread(const std::string& name);
// The median over 5 blocks of 400 round trips of one cache line between a thread pinned to CPU 0
// and one pinned to CPU 1, in ns per round trip (about a millisecond in all); 0 on a machine with
// one CPU. The calling thread's affinity is restored.
double CrossCoreRoundTripNs();

}  // namespace cqd::bench

#endif  // CQD_BENCHMARKS_MACHINE_H_
