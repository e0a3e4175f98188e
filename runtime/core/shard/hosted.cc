// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/shard/hosted.h"

#include <algorithm>

namespace cqd::internal {

int HostedConsumers::Poll() noexcept {
  if (hosted_.empty()) return 0;
  // Handlers may call the runtime from here (thread_role.h).
  const HostedDispatchScope dispatching(duty_.serve, duty_.owner);
  int worked = 0;
  for (Consumer* consumer : hosted_) {
    // A few batches per pass, so that polling goes on under a steady stream.
    for (int round = 0; round < 4; ++round) {
      const int n = DispatchOne(*consumer);
      if (n == 0) break;
      worked += n;
    }
  }
  return worked;
}

bool HostedConsumers::Pending() const noexcept {
  for (const Consumer* consumer : hosted_) {
    if (consumer->Pending() || !spills_.lane(consumer->index()).spill_empty()) return true;
  }
  return false;
}

int HostedConsumers::DispatchOne(Consumer& consumer) noexcept {
  // What this shard queued is older than its spill: the queue goes first.
  if (consumer.Pending()) return consumer.Dispatch(1024);
  Lane& lane = spills_.lane(consumer.index());
  if (lane.spill_empty()) return 0;
  const uint64_t begin = lane.published();
  const uint32_t at = lane.IndexOf(begin);
  const uint32_t n = std::min({lane.spill_size(), static_cast<uint32_t>(consumer.dispatch_batch()),
                               static_cast<uint32_t>(lane.size() - at)});
  // Out of the spill before any handler runs: one may purge it (Unregister runs inline here).
  // The ring keeps the entries until DispatchLane releases them.
  lane.Publish(n);
  spills_.NoteSpill(consumer.index());
  consumer.DispatchLane(lane, at, n, begin + n);
  // Everything this lane held is dispatched and released, on this thread: start the ring over
  // (TryRewind checks that), so the next poll writes lines this one has just used, still in this
  // core's cache, as an inline loop's poll array is. The check reads only this thread's stores.
  if (lane.spill_empty() && lane.tail_at() != 0) lane.TryRewind();
  return static_cast<int>(n);
}

void HostedConsumers::Close() noexcept {
  // The consumers' last handlers run here (events posted meanwhile go straight to their queues,
  // and whatever a handler's control call routes here meanwhile is dispatched from the spill);
  // then they close.
  for (Consumer* consumer : hosted_) {
    const Lane& lane = spills_.lane(consumer->index());
    while (!lane.spill_empty() || !consumer->CloseIfEmpty()) (void)Poll();
  }
}

int HostedConsumers::CloseStep() noexcept {
  // As the thread does when it stops: dispatch what the consumers hold, then close them.
  int work = 0;
  for (Consumer* consumer : hosted_) {
    const Lane& lane = spills_.lane(consumer->index());
    if (lane.spill_empty() && consumer->CloseIfEmpty()) continue;
    for (int round = 0; round < 4; ++round) {
      int n;
      {
        const HostedDispatchScope dispatching(duty_.serve, duty_.owner);
        n = DispatchOne(*consumer);
      }
      if (n == 0) break;
      work += n;
    }
  }
  return work;
}

}  // namespace cqd::internal
