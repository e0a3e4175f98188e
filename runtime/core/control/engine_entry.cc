// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/engine_entry.h"

#include <cerrno>
#include <string>

#include "runtime/base/thread_role.h"

namespace cqd::internal {

EngineEntry::EngineEntry(ControlCore& core) : core_(core) {
  for (const auto& consumer : core_.consumers) {
    if (consumer->kind() == ConsumerKind::kEngineDriven) {
      threads_.push_back(&consumer->last_drainer());
    }
  }
  for (const auto& poller : core_.pollers) {
    if (poller->engine_driven()) threads_.push_back(&poller->last_driver());
  }
}

int EngineEntry::Drain(ConsumerId consumer, int max) noexcept {
  if (consumer >= core_.consumers.size()) return -EINVAL;
  Consumer& c = *core_.consumers[consumer];
  if (c.kind() != ConsumerKind::kEngineDriven) return -EINVAL;
  if (c.DispatchingHere()) return -EBUSY;  // from one of its own handlers
  // A poller or the event thread (an OrphanHandler, a DeviceEventHandler) or the log sink: the
  // handlers would run where their control calls are refused (or under the runtime's mutex).
  if (CallerRoles() & kRefusedControlCallers) return -EBUSY;
  if (max <= 0) {
    if (c.DrainingElsewhere()) return -EBUSY;  // one thread at a time, as any Drain
    c.NoteDrainer();  // a Drain of nothing still says which thread drains (Teardown::Wait)
    return 0;
  }
  return c.Drain(max);
}

// Any role at all (what Runtime::InCallback answers): a poller's or the event thread, a handler
// of any kind, an OrphanHandler or DeviceEventHandler, on_done on the teardown thread, the log
// sink. Driving a shard from there would nest one poller's pass inside another's (or inside a
// consumer's batch, or under the runtime's mutex, or make the teardown thread the shard's
// sleeper), and a wait duty serves one shard only.
static bool InsideRuntimeCallback() noexcept { return CallerRoles() != 0; }

int EngineEntry::PollShard(int shard, int budget) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= core_.pollers.size() || budget < 1) return -EINVAL;
  Shard& poller = *core_.pollers[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.Step(budget);
}

int EngineEntry::TrySleepShard(int shard) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= core_.pollers.size()) return -EINVAL;
  Shard& poller = *core_.pollers[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.PrepareSleep();
}

Result<int> EngineEntry::ShardFd(int shard) {
  if (shard < 0 || static_cast<size_t>(shard) >= core_.pollers.size()) {
    return InvalidArgument("ShardFd: shard " + std::to_string(shard) + " is not in 0.." +
                           std::to_string(core_.pollers.size() - 1));
  }
  if (!core_.pollers[shard]->engine_driven()) {
    return InvalidArgument("ShardFd: shard " + std::to_string(shard) +
                           " has a poller thread of the runtime; only engine-driven shards "
                           "(RuntimeOptions::engine_shards) have a shard fd");
  }
  return core_.pollers[shard]->fd();
}

Result<int> EngineEntry::NotifyFd(ConsumerId consumer) {
  if (consumer >= core_.consumers.size()) {
    return InvalidArgument("NotifyFd: consumer " + std::to_string(consumer) + " is not in 0.." +
                           std::to_string(core_.consumers.size() - 1));
  }
  if (core_.consumers[consumer]->kind() != ConsumerKind::kEngineDriven) {
    return InvalidArgument("NotifyFd: consumer " + std::to_string(consumer) +
                           " is runtime-owned; only engine-driven consumers have a notify fd");
  }
  return core_.consumers[consumer]->notify_fd();
}

}  // namespace cqd::internal
