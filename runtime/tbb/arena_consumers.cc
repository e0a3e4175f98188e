// SPDX-License-Identifier: BSD-2-Clause
// ArenaConsumers and ArenaConstraintsFor (cqd/tbb.h): thin layers over ArenaDrainer.
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <fstream>
#include <new>
#include <string>

#include "cqd/tbb.h"
#include "runtime/tbb/arena_drainer.h"

namespace cqd {
namespace {

// Returns the NUMA node sysfs gives for an RDMA device, or -1.
int SysfsNumaNode(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return -1;
  }
  std::ifstream in("/sys/class/infiniband/" + name + "/device/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

}  // namespace

Result<::tbb::task_arena::constraints> ArenaConstraintsFor(const Runtime& runtime, DeviceId device,
                                                           int max_concurrency) {
  if (max_concurrency == 0 || max_concurrency < -1) {
    return InvalidArgument("ArenaConstraintsFor: max_concurrency " +
                           std::to_string(max_concurrency) + " is neither -1 nor positive");
  }
  try {
    const Stats stats = runtime.GetStats();
    auto it = std::find_if(stats.devices.begin(), stats.devices.end(),
                           [&](const DeviceStats& d) { return d.id == device; });
    if (it == stats.devices.end()) {
      return NotFound("ArenaConstraintsFor: device " + std::to_string(device) +
                      " is not a device of this runtime (" + std::to_string(stats.devices.size()) +
                      " devices)");
    }
    int node = it->numa_node;
    if (node < 0) node = SysfsNumaNode(it->name);
    ::tbb::task_arena::constraints c;
    c.max_concurrency = max_concurrency;
    if (node < 0) return c;  // unknown: TBB's topology (tbbbind, hwloc) is not even loaded
    const std::vector<::tbb::numa_node_id> nodes = ::tbb::info::numa_nodes();
    if (nodes.size() > 1 && std::find(nodes.begin(), nodes.end(), node) != nodes.end()) {
      c.numa_id = node;
    }
    return c;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("ArenaConstraintsFor: out of memory");
  }
}

ArenaConsumers::ArenaConsumers(std::unique_ptr<internal::ArenaDrainer> drainer)
    : drainer_(std::move(drainer)) {}

Result<std::unique_ptr<ArenaConsumers>> ArenaConsumers::Create(
    Runtime& runtime, ::tbb::task_arena& arena, const ArenaConsumersOptions& options) {
  try {
    auto drainer = internal::ArenaDrainer::Create(runtime, arena, options.consumers,
                                                  options.watcher_thread, options.drain_budget,
                                                  options.linger, "ArenaConsumers::Create");
    if (!drainer.ok()) return drainer.status();
    return std::unique_ptr<ArenaConsumers>(new ArenaConsumers(std::move(drainer).value()));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("ArenaConsumers::Create: out of memory");
  }
}

ArenaConsumers::~ArenaConsumers() { (void)drainer_->Stop(); }

bool ArenaConsumers::OnReadable(ConsumerId consumer) noexcept {
  return drainer_->OnReadable(consumer);
}

Status ArenaConsumers::Stop() {
  if (Status refused = internal::RefuseWaitInCallback("ArenaConsumers::Stop"); !refused.ok()) {
    return refused;
  }
  Status stopped = drainer_->Stop();
  if (stopped.ok()) drainer_->Unhost();
  return stopped;
}

ArenaStats ArenaConsumers::GetStats() const { return drainer_->GetStats(); }

}  // namespace cqd
