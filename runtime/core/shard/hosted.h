// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/shard/hosted.h: the run-to-completion consumers a shard dispatches itself
// (ConsumerKind::kRunToCompletion with `poller` this shard).
//
// As a stage, after the CQs: a few batches of each hosted consumer per pass, so that polling goes
// on under a steady stream; a batch comes from its queue if anything is queued (what the shard
// handed over is older than its spill), else in place from the spill of this shard's lane. The
// entries leave the spill before the first handler runs, so a control call's purge (Unregister,
// run inline here) cannot move them under it. While a consumer's queue and spill are empty its
// CQs' polls may run its handlers as they are routed (fused_poll.h). Handlers run with the wait
// duty of thread_role.h set: they may make control calls, and the calls that would wait for this
// shard run inline. Producers wake the shard instead of such a consumer (Consumer::RunOnPoller),
// so TryEnterIdle re-checks their queues. When the shard stops, Close dispatches what they still
// hold and closes them.
//
// Threading: the shard's driver only.
#ifndef CQD_RUNTIME_CORE_SHARD_HOSTED_H_
#define CQD_RUNTIME_CORE_SHARD_HOSTED_H_

#include <vector>

#include "runtime/base/thread_role.h"
#include "runtime/core/consumer.h"
#include "runtime/core/shard/spills.h"

namespace cqd::internal {

class HostedConsumers {
 public:
  // `duty`: what the handlers' waits serve (the shard's mailbox).
  HostedConsumers(Spills& spills, WaitDuty duty) : spills_(spills), duty_(duty) {}
  HostedConsumers(const HostedConsumers&) = delete;
  HostedConsumers& operator=(const HostedConsumers&) = delete;

  // Before the shard starts: `consumer` is dispatched here.
  void Add(Consumer* consumer) { hosted_.push_back(consumer); }
  bool empty() const noexcept { return hosted_.empty(); }

  // Stage: a few batches of each; returns how many entries ran.
  int Poll() noexcept;
  // Stage: true if nothing waits in a hosted consumer's queue or spill.
  bool TryEnterIdle() const noexcept { return !Pending(); }
  bool Pending() const noexcept;
  // The shard's thread has stopped polling: runs what they still hold and closes them. An
  // engine-driven shard's Steps after Stop call CloseStep instead (a few batches each; returns
  // the entries run, 0 once all are closed).
  void Close() noexcept;
  int CloseStep() noexcept;

 private:
  // One batch of `consumer`: from its queue if anything is queued, else in place from the spill
  // of this shard's lane. Returns how many entries it ran.
  int DispatchOne(Consumer& consumer) noexcept;

  Spills& spills_;
  const WaitDuty duty_;
  std::vector<Consumer*> hosted_;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_SHARD_HOSTED_H_
