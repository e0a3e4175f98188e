// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/control/engine_entry.h: the engine's entry points into the threads it drives:
// Drain of an engine-driven consumer, PollShard and TrySleepShard of an engine-driven shard, and
// their fds; and the tokens of those engine threads (TeardownState::engine_threads).
//
// Threading: engine threads; none takes core.mu. Drain, PollShard and TrySleepShard are
// noexcept: -EINVAL for what is not an engine-driven consumer or shard, -EBUSY from inside a cqd
// callback where they must not run (caller.h) or, for Drain, while another thread drains. The
// token list is fixed after the constructor; the tokens are loaded relaxed (CallerRoles).
#ifndef CQD_RUNTIME_CORE_CONTROL_ENGINE_ENTRY_H_
#define CQD_RUNTIME_CORE_CONTROL_ENGINE_ENTRY_H_

#include "cqd/status.h"
#include "cqd/types.h"
#include "runtime/core/caller.h"
#include "runtime/core/control/control_core.h"

namespace cqd::internal {

class EngineEntry {
 public:
  // Collects the engine threads' tokens of `core`'s consumers and pollers (built).
  explicit EngineEntry(ControlCore& core);
  EngineEntry(const EngineEntry&) = delete;
  EngineEntry& operator=(const EngineEntry&) = delete;

  // Returns how many items it delivered, or -EINVAL / -EBUSY (Runtime::Drain).
  int Drain(ConsumerId consumer, int max) noexcept;
  // Returns the consumer's notify fd, or kInvalidArgument unless it is engine-driven.
  Result<int> NotifyFd(ConsumerId consumer);
  // Engine-driven shards: Runtime::PollShard, TrySleepShard, ShardFd.
  int PollShard(int shard, int budget) noexcept;
  int TrySleepShard(int shard) noexcept;
  Result<int> ShardFd(int shard);

  // Returns the "last drainer" and "last driver" tokens of every engine-driven consumer and shard.
  const EngineThreads& threads() const { return threads_; }

 private:
  ControlCore& core_;
  EngineThreads threads_;  // fixed after the constructor
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_CONTROL_ENGINE_ENTRY_H_
