// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/placement.h: where the runtime's threads run and which completion vector a CQ uses.
//
// NUMA: devices are added after Runtime::Create has started the threads, so placement happens
// when the first verbs device whose NUMA node sysfs knows is added
// (<sysfs>/class/infiniband/<dev>/device/numa_node). Pollers and runtime-owned consumers that
// have no CPU of their own (RuntimeOptions::poller_cpus empty, ConsumerOptions::cpu == -1) are
// then confined to that node's CPUs (<sysfs>/devices/system/node/node<N>/cpulist) that the
// process may run on (sched_getaffinity), as one set: the scheduler still balances the threads
// over the node's CPUs. Nothing is pinned when the device has no node (-1: one-node machines,
// virtual devices such as rxe), when the node's CPUs are all the process may use anyway (a
// one-node machine), or when the process may use none of them. It happens at most once per
// runtime: the threads serve every device, so a later device on another node moves nothing.
// The simulated device has no node. RuntimeOptions::auto_placement = false turns it off.
//
// Completion vectors: CreateCq with CqOptions::comp_vector == -1 spreads the CQs of each device
// round robin over its ibv_context::num_comp_vectors (0 with auto_placement off); an explicit
// vector must be one the device has. The simulated device has one vector.
//
// sysfs alone, not oneTBB's tbb::info::numa_nodes(): that needs libtbbbind and hwloc at run time
// (without them it reports one node and no error), it knows no RDMA device's node (sysfs is where
// that lives anyway), and the runtime links no TBB; two small files cover what is needed.
//
// Threading: the free functions may be called from any thread. Placement's methods take its own
// mutex and never call back into the runtime, so any thread may call them, GetStats included;
// OnDeviceAdded and CompVector are called by the control path.
#ifndef CQD_RUNTIME_CORE_PLACEMENT_H_
#define CQD_RUNTIME_CORE_PLACEMENT_H_

#include <pthread.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cqd/options.h"
#include "cqd/stats.h"
#include "cqd/status.h"
#include "runtime/base/mutex.h"

namespace cqd::internal {

// Returns the CPUs of a Linux cpulist ("0-3,8-11", "5", "" for none; a trailing newline is
// fine), sorted and without duplicates, or nullopt if it is malformed.
std::optional<std::vector<int>> ParseCpuList(std::string_view text);
// Returns `cpus` (sorted) as a cpulist, e.g. "0-3,8-11"; "" for none.
std::string FormatCpuList(const std::vector<int>& cpus);

// Returns the NUMA node of RDMA device `device` from <sysfs_root>/class/infiniband/<device>/
// device/numa_node, or -1 if the file is missing, unreadable or says -1.
int DeviceNumaNode(const std::string& sysfs_root, const std::string& device);
// Returns the CPUs of `node` from <sysfs_root>/devices/system/node/node<node>/cpulist; empty if
// node < 0 or the file is missing or malformed.
std::vector<int> NodeCpus(const std::string& sysfs_root, int node);
// Returns the CPUs the calling thread may run on (sched_getaffinity); empty if that fails.
std::vector<int> AllowedCpus();

// Returns the CPUs to confine unpinned threads to: `node_cpus` that are in `allowed`; empty (do
// nothing) if there are none, or if they are all of `allowed` (placement would change nothing).
std::vector<int> LocalCpus(const std::vector<int>& node_cpus, const std::vector<int>& allowed);

// Returns the completion vector for a CQ: `requested` if in 0..vectors-1, else kInvalidArgument
// unless it is -1, which picks `next++ % vectors` with `spread`, else 0.
Result<int> ChooseCompVector(int requested, int vectors, bool spread, uint32_t& next);

// Sets the affinity of `thread` to `cpus`; returns false if that fails.
bool ConfineThread(pthread_t thread, const std::vector<int>& cpus);

class Placement {
 public:
  // `sysfs_root`: "/sys", or a fake tree in tests. `allowed`: the CPUs the process may run on
  // (AllowedCpus() when nullopt, read when a device is added).
  explicit Placement(const RuntimeOptions& options, std::string sysfs_root = "/sys",
                     std::optional<std::vector<int>> allowed = std::nullopt);

  // The runtime's threads that placement may move: a native handle per poller and per consumer,
  // 0 for an engine-driven consumer (no thread of the runtime's).
  struct Threads {
    std::vector<pthread_t> pollers;
    std::vector<pthread_t> consumers;
  };
  // Control path, after device `id` was added. `verbs`: a verbs device (the simulated one has no
  // node and one vector); `comp_vectors`: its ibv_context::num_comp_vectors. The first verbs
  // device with a known node places the threads that have no explicit CPU (see above).
  void OnDeviceAdded(uint32_t id, const std::string& name, bool verbs, int comp_vectors,
                     const Threads& threads);
  // Control path: the completion vector for a new CQ on device `id` (see ChooseCompVector);
  // kInvalidArgument names the device's vectors.
  Result<int> CompVector(uint32_t id, int requested);

  // Fills the placement fields of `stats`: PollerStats::numa_node, ConsumerStats::cpu and
  // numa_node, Stats::placement_cpus and Stats::devices. The poller and consumer vectors must
  // already hold one entry per poller and consumer.
  void FillStats(Stats& stats) const;

 private:
  struct Device {
    std::string name;
    int numa_node = -1;
    int comp_vectors = 1;
    uint32_t next_vector = 0;
  };
  const bool enabled_;
  const std::vector<int> poller_cpus_;  // RuntimeOptions::poller_cpus
  std::vector<int> consumer_cpus_;      // ConsumerOptions::cpu
  const std::string sysfs_root_;
  const std::optional<std::vector<int>> allowed_;
  mutable Mutex mu_;
  std::map<uint32_t, Device> devices_ CQD_GUARDED_BY(mu_);
  bool placed_ CQD_GUARDED_BY(mu_) = false;    // a device was considered for it
  int node_ CQD_GUARDED_BY(mu_) = -1;          // the node threads were placed on
  std::vector<int> cpus_ CQD_GUARDED_BY(mu_);  // ... and the CPUs, empty if none
  std::vector<bool> poller_placed_ CQD_GUARDED_BY(mu_);
  std::vector<bool> consumer_placed_ CQD_GUARDED_BY(mu_);
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_PLACEMENT_H_
