// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/options_check.h"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/core/lane.h"
#include "runtime/observe/stats_server.h"

namespace cqd::internal {
namespace {

// Each integer as its own type prints it: a size_t of 2^63 or more stays positive.
template <typename Int>
std::string Str(Int v) {
  return std::to_string(v);
}

std::string Octal(uint32_t v) {
  char text[16];
  snprintf(text, sizeof(text), "0%o", v);
  return text;
}

Status CheckCpu(const char* what, int cpu) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return ErrnoStatus(what, errno);
  if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
    return InvalidArgument(std::string(what) + ": CPU " + Str(cpu) +
                           " is not one this process may run on");
  }
  return Status::Ok();
}

// The idle waits are compared with clock differences in nanoseconds: bounded so that they
// cannot overflow there.
Status CheckWait(const char* what, std::chrono::microseconds wait) {
  constexpr std::chrono::microseconds kMax = std::chrono::hours(24);
  if (wait.count() < 0 || wait > kMax) {
    return InvalidArgument(std::string(what) + " is " + Str(wait.count()) + " us, must be in 0.." +
                           Str(kMax.count()) + " (one day)");
  }
  return Status::Ok();
}

// The address space a process may map: RLIMIT_AS if set, else the 47 bits of x86-64's (and
// arm64's usual) user space.
uint64_t AddressSpace() {
  constexpr uint64_t kUserSpace = uint64_t{1} << 47;
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    return std::min<uint64_t>(limit.rlim_cur, kUserSpace);
  }
  return kUserSpace;
}

// The consumers' lanes are reserved at once (lane.h: address space; pages come as they are
// used): a runtime whose lanes cannot fit is refused before anything is reserved, rather than
// after reserving until memory runs out.
Status CheckLaneSpace(const RuntimeOptions& o) {
  constexpr uint64_t kEntry = sizeof(ibv_wc) + sizeof(EntryMeta);
  long double bytes = 0;  // up to 256 * 1024 * 2^26 entries: wider than is safe in 64 bits
  for (const ConsumerOptions& c : o.consumers) {
    bytes += static_cast<long double>(o.pollers) *
             (static_cast<long double>(c.queue_capacity) + c.spill_capacity) * kEntry;
  }
  const uint64_t space = AddressSpace();
  if (bytes <= static_cast<long double>(space)) return Status::Ok();
  char need[32];
  snprintf(need, sizeof(need), "%.3Lg", bytes);
  return ResourceExhausted("the consumers' lanes would take " + std::string(need) +
                           " bytes of address space (pollers x the sum over consumers of "
                           "(queue_capacity + spill_capacity) x " +
                           Str(kEntry) + " bytes), more than the process has (" + Str(space) +
                           " bytes); lower pollers, consumers or their capacities");
}

}  // namespace

Status CheckOptions(const RuntimeOptions& o) {
  if (o.pollers < 1 || o.pollers > 256) {
    return InvalidArgument("pollers is " + Str(o.pollers) + ", must be in 1..256");
  }
  for (size_t i = 0; i < o.engine_shards.size(); ++i) {
    const int shard = o.engine_shards[i];
    if (shard < 0 || shard >= o.pollers) {
      return InvalidArgument("engine_shards[" + Str(i) + "] is " + Str(shard) +
                             ", must be a shard in 0.." + Str(o.pollers - 1));
    }
    for (size_t j = 0; j < i; ++j) {
      if (o.engine_shards[j] == shard) {
        return InvalidArgument("engine_shards names shard " + Str(shard) + " twice");
      }
    }
  }
  if (!o.poller_cpus.empty()) {
    if (o.poller_cpus.size() != static_cast<size_t>(o.pollers)) {
      return InvalidArgument("poller_cpus has " + Str(o.poller_cpus.size()) +
                             " entries, must be empty or one per poller (" + Str(o.pollers) + ")");
    }
    for (int shard = 0; shard < o.pollers; ++shard) {
      // An engine-driven shard's entry is ignored (options.h): the engine places its threads.
      if (std::find(o.engine_shards.begin(), o.engine_shards.end(), shard) !=
          o.engine_shards.end()) {
        continue;
      }
      const std::string what = "poller_cpus[" + Str(shard) + "]";
      if (Status s = CheckCpu(what.c_str(), o.poller_cpus[shard]); !s.ok()) return s;
    }
  }
  if (o.poll_batch < 1 || o.poll_batch > 1024) {
    return InvalidArgument("poll_batch is " + Str(o.poll_batch) + ", must be in 1..1024");
  }
  if (Status s = CheckWait("idle_budget", o.idle_budget); !s.ok()) return s;
  if (Status s = CheckWait("cq_park_after", o.cq_park_after); !s.ok()) return s;
  if (o.ack_threshold < 1) return InvalidArgument("ack_threshold must be at least 1");
  if (o.stats_socket_mode > 0777 || (o.stats_socket_mode & 0200) == 0) {
    return InvalidArgument("stats_socket_mode is " + Octal(o.stats_socket_mode) +
                           ", must be permission bits (at most 0777) that let the owner connect "
                           "(0200)");
  }
  if (o.max_registrations < 1 || o.max_registrations > (1u << 24)) {
    return InvalidArgument("max_registrations is " + Str(o.max_registrations) +
                           ", must be in 1..16777216");
  }
  if (o.consumers.empty() || o.consumers.size() > 1024) {
    return InvalidArgument("consumers has " + Str(o.consumers.size()) +
                           " entries, must be 1..1024");
  }
  for (size_t i = 0; i < o.consumers.size(); ++i) {
    const ConsumerOptions& c = o.consumers[i];
    std::string who = "consumers[" + Str(i) + "]";
    if (c.kind != ConsumerKind::kOwnedThread && c.kind != ConsumerKind::kEngineDriven &&
        c.kind != ConsumerKind::kRunToCompletion) {
      return InvalidArgument(who + ".kind is not a ConsumerKind");
    }
    if (c.kind == ConsumerKind::kRunToCompletion && (c.poller < 0 || c.poller >= o.pollers)) {
      return InvalidArgument(who + ".poller is " + Str(c.poller) + ", must be in 0.." +
                             Str(o.pollers - 1));
    }
    if (c.kind == ConsumerKind::kRunToCompletion && c.cpu != -1) {
      return InvalidArgument(who + ".cpu is " + Str(c.cpu) +
                             ", must be -1: a kRunToCompletion consumer runs on its poller's "
                             "thread (see poller_cpus)");
    }
    if (c.queue_capacity < 1 || c.queue_capacity > (1u << 26)) {
      return InvalidArgument(who + ".queue_capacity is " + Str(c.queue_capacity) +
                             ", must be in 1..67108864");
    }
    if (c.spill_capacity < 1 || c.spill_capacity > (1u << 20)) {
      return InvalidArgument(who + ".spill_capacity is " + Str(c.spill_capacity) +
                             ", must be in 1..1048576");
    }
    if (c.dispatch_batch < 1 || c.dispatch_batch > 1024) {
      return InvalidArgument(who + ".dispatch_batch is " + Str(c.dispatch_batch) +
                             ", must be in 1..1024");
    }
    if (Status s = CheckWait((who + ".idle_spin").c_str(), c.idle_spin); !s.ok()) return s;
    if (c.kind == ConsumerKind::kOwnedThread && c.cpu != -1) {  // kEngineDriven: ignored
      if (Status s = CheckCpu((who + ".cpu").c_str(), c.cpu); !s.ok()) return s;
    }
  }
  if (!o.stats_tcp.empty()) {
    if (Status s = StatsServer::CheckTcp(o.stats_tcp, o.stats_tcp_allow_remote); !s.ok()) {
      return s;
    }
  }
  if (!o.stats_socket.empty()) {
    if (Status s = StatsServer::CheckPath(o.stats_socket); !s.ok()) return s;
  }
  return CheckLaneSpace(o);
}

}  // namespace cqd::internal
