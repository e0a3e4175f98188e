// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/runtime_qps.cc: RuntimeImpl's registrations and teardowns
// (runtime_impl.h): RegisterQp, retiring a registration (Unregister, a teardown's end) and its
// fences, and TeardownQp with the teardown thread's callbacks (TeardownHost).
#include <algorithm>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/mutex.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"
#include "runtime/core/runtime_impl.h"

namespace cqd::internal {

Result<RegisteredQp> RuntimeImpl::RegisterQp(uint32_t qp_num, void* native_qp, void* send_native,
                                             void* recv_native, QpHandler& handler,
                                             ConsumerId consumer, const QpOptions& options) {
  if (Status refused = CheckCaller("RegisterQp"); !refused.ok()) return refused;
  ControlLock lock(mu_);
  if (shut_down_) return FailedPrecondition("RegisterQp: the runtime is shut down");
  if (consumer >= consumers_.size()) {
    return InvalidArgument("RegisterQp: consumer " + std::to_string(consumer) + " is not in 0.." +
                           std::to_string(consumers_.size() - 1));
  }
  if (qp_num > 0xffffff) return InvalidArgument("RegisterQp: qp_num exceeds 24 bits");
  CqRecord* send = cqs_.FindNative(send_native);
  CqRecord* recv = cqs_.FindNative(recv_native);
  if (send == nullptr || recv == nullptr) {
    return NotFound("RegisterQp: qp_num " + std::to_string(qp_num) + ": its " +
                    (send == nullptr ? "send" : "recv") + " CQ is not polled by this runtime");
  }
  if (send->device != recv->device) {
    return InvalidArgument("RegisterQp: send and recv CQs belong to different devices");
  }
  if (const ConsumerOptions& c = options_.consumers[consumer];
      c.kind == ConsumerKind::kRunToCompletion &&
      (send->shard != c.poller || recv->shard != c.poller)) {
    return InvalidArgument(
        "RegisterQp: consumer " + std::to_string(consumer) + " runs to completion on poller " +
        std::to_string(c.poller) + ", but the QP's " + (send->shard != c.poller ? "send" : "recv") +
        " CQ is on shard " + std::to_string(send->shard != c.poller ? send->shard : recv->shard));
  }
  DeviceRecord* device = send->device;
  if (device->qps.Lookup(qp_num) != nullptr) {
    return AlreadyExists("RegisterQp: qp_num " + std::to_string(qp_num) + " is already registered");
  }
  // The capacity guard: what the QP may have outstanding, plus a teardown marker per queue.
  if (options.send_wrs < -1 || options.recv_wrs < -1) {
    return InvalidArgument("RegisterQp: send_wrs and recv_wrs must be -1 (from the QP) or >= 0");
  }
  Result<backend::QpCaps> caps = device->backend->QueryQp(native_qp);
  if (!caps.ok()) return Status(caps.status().code(), "RegisterQp: " + caps.status().message());
  const uint64_t send_wrs =
      static_cast<uint64_t>(options.send_wrs >= 0 ? options.send_wrs : caps->max_send_wr) + 1;
  const uint64_t recv_wrs =
      caps->srq
          ? 0
          : static_cast<uint64_t>(options.recv_wrs >= 0 ? options.recv_wrs : caps->max_recv_wr) + 1;
  // What no later state of the CQs could take is refused for good first, not "register again
  // later" by the fence check below.
  for (CqRecord* cq : {send, recv}) {
    const uint64_t wrs = send == recv ? send_wrs + recv_wrs : cq == send ? send_wrs : recv_wrs;
    const uint64_t most = cq->grow ? kCqGrowthCeiling : static_cast<uint64_t>(cq->cq->depth());
    if (wrs > most) {
      return ResourceExhausted("RegisterQp: qp_num " + std::to_string(qp_num) + ": CQ " +
                               std::to_string(cq->id) + " can never hold the " +
                               std::to_string(wrs) +
                               " work requests this QP alone may have "
                               "outstanding (S11): " +
                               (cq->grow ? "past the 2^30 a CQ may grow to"
                                         : "it has depth " + std::to_string(cq->cq->depth()) +
                                               " and was created with grow = false"));
    }
  }
  // A retired QP that had this number may still have completions in these CQs: the number is
  // registered there only once they have been polled out (fences.h), so none reaches this QP.
  // A QP in the error state may be that retired QP itself: its markers must come back first, and
  // moving it to the error state again (harmless there) lets out what a device held back. A
  // failed device sends nothing back: there the catch-up decides, as for any QP.
  const bool fenced = send->fences.load(std::memory_order_relaxed) != 0 ||
                      recv->fences.load(std::memory_order_relaxed) != 0;
  const void* in_error_qp =
      caps->in_error && !device->failed.load(std::memory_order_acquire) ? native_qp : nullptr;
  if (fenced && in_error_qp != nullptr) (void)device->backend->RedriveFlush(native_qp, 0);
  for (CqRecord* cq : {send, recv}) {
    const bool retired_here = cq->retired.Contains(qp_num);
    if ((retired_here || cq->fences.load(std::memory_order_relaxed) != 0) &&
        !pollers_[cq->shard]->FenceForReuse(cq, qp_num, in_error_qp, retired_here)) {
      Status refused = Unavailable(
          "RegisterQp: qp_num " + std::to_string(qp_num) + ": CQ " + std::to_string(cq->id) +
          " still holds completions of a retired QP that had this number, and a consumer it "
          "serves is too full for the runtime to poll them out now "
          "(ConsumerStats::spill_depth), or (a QP in the error state) that QP's teardown "
          "markers have not come back yet; register again later");
      if (log_.enabled()) log_.Debug(refused.message());
      return refused;
    }
  }
  if (send == recv) {
    if (Status s = Commit(send, send_wrs + recv_wrs, qp_num); !s.ok()) return s;
  } else {
    if (Status s = Commit(send, send_wrs, qp_num); !s.ok()) return s;
    if (Status s = Commit(recv, recv_wrs, qp_num); !s.ok()) return s;
  }
  int64_t index = slots_.Allocate();
  if (index == -1) {
    return ResourceExhausted("RegisterQp: all " + std::to_string(slots_.capacity()) +
                             " registrations (max_registrations) are in use");
  }
  if (index < 0) return ResourceExhausted("RegisterQp: out of memory for registration slots");
  Slot& slot = slots_.slot(static_cast<uint32_t>(index));
  uint32_t generation = StateGeneration(slot.state.load(std::memory_order_relaxed));
  slot.handler.store(&handler, std::memory_order_relaxed);
  slot.qp_num.store(qp_num, std::memory_order_relaxed);
  slot.device.store(device->id, std::memory_order_relaxed);
  slot.send_cq.store(send->id, std::memory_order_relaxed);
  slot.recv_cq.store(recv->id, std::memory_order_relaxed);
  slot.send_shard.store(static_cast<uint16_t>(send->shard), std::memory_order_relaxed);
  slot.recv_shard.store(static_cast<uint16_t>(recv->shard), std::memory_order_relaxed);
  slot.qp.store(native_qp, std::memory_order_relaxed);
  slot.teardown.store(nullptr, std::memory_order_relaxed);
  slot.send_commit = static_cast<uint32_t>(send_wrs);
  slot.recv_commit = static_cast<uint32_t>(recv_wrs);
  send->committed += send_wrs;
  recv->committed += recv_wrs;
  // The pollers learn which consumer the CQs serve before the first completion can be routed.
  pollers_[send->shard]->AddUse(send, consumer);
  if (recv != send) pollers_[recv->shard]->AddUse(recv, consumer);
  slot.state.store(MakeState(generation, consumer, true), std::memory_order_release);
  device->qps.Set(qp_num, &slot);
  send->retired.Remove(qp_num);  // polled out above: what the old QP left is gone
  recv->retired.Remove(qp_num);
  ++send->registered_qps;
  ++recv->registered_qps;
  live_registrations_.fetch_add(1, std::memory_order_relaxed);
  return RegisteredQp{static_cast<uint32_t>(index), generation, qp_num};
}

BatchTicket RuntimeImpl::Retire(uint32_t index, uint32_t generation, TeardownState* ending) {
  Slot& slot = slots_.slot(index);
  uint64_t state = slot.state.load(std::memory_order_relaxed);
  if (!StateLiveAs(state, generation)) return {};  // not retired
  uint32_t consumer = StateConsumer(state);
  const uint32_t send_id = slot.send_cq.load(std::memory_order_relaxed);
  const uint32_t recv_id = slot.recv_cq.load(std::memory_order_relaxed);
  const uint32_t ids[2] = {send_id, recv_id};
  const uint32_t commits[2] = {slot.send_commit, slot.recv_commit};
  CqRecord* cqs[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; ++k) {
    cqs[k] = cqs_.Find(ids[k]);
    // Whatever the QP completes from now on waits in the CQ for nobody; the number is polled out
    // of it before it registers here again (retired_numbers.h).
    if (cqs[k] != nullptr) cqs[k]->retired.Add(slot.qp_num.load(std::memory_order_relaxed));
  }
  // A teardown's fences before the registration dies: a pass before this saw it live and
  // tearing down and marked what it polled; a pass after finds the fence first. (The other way
  // round, a pass in between would take a marker for nobody's and orphan it, and its fence would
  // wait for it in vain.) A plain Unregister has no markers: its fences come after the death, so
  // that the poller this wakes polls what the CQ still holds for nobody (the orphan sink, at once)
  // rather than for the QP's consumer.
  const uint32_t qp_num = slot.qp_num.load(std::memory_order_relaxed);
  const void* qp = slot.qp.load(std::memory_order_relaxed);
  if (ending != nullptr) FenceRetired(ending, qp_num, qp, cqs, commits);
  ChaosPoint();  // fenced, still live: passes route to it meanwhile
  // Dead, with the next generation: items already routed with this one become orphans.
  slot.state.store(MakeState(generation + 1, consumer, false), std::memory_order_seq_cst);
  ChaosPoint();
  if (ending == nullptr) FenceRetired(nullptr, qp_num, qp, cqs, commits);
  live_registrations_.fetch_sub(1, std::memory_order_relaxed);
  DeviceRecord* device = devices_[slot.device.load(std::memory_order_relaxed) - 1].get();
  if (device->qps.Lookup(qp_num) == &slot) device->qps.Clear(qp_num);
  for (int k = 0; k < 2; ++k) {
    CqRecord* cq = cqs[k];
    if (cq == nullptr) continue;
    --cq->registered_qps;
    cq->committed -= commits[k];
    if (k == 1 && recv_id == send_id) continue;  // one CQ for both: one use
    pollers_[cq->shard]->DropUse(cq, consumer);
  }
  slot.teardown.store(nullptr, std::memory_order_release);
  // What the pollers still hold for this registration becomes orphans now, so that a consumer
  // that stopped draining does not keep CQs of others held back for QPs that are gone.
  for (uint16_t shard : {slot.send_shard.load(std::memory_order_relaxed),
                         slot.recv_shard.load(std::memory_order_relaxed)}) {
    pollers_[shard]->PurgeDead(consumer);
  }
  // Its connection events still on their way go to the CmHandler now, in read order, wherever
  // their parts wait (cm_router.h); they run there, or in HeldEvents after Shutdown.
  events_->cm().Ended(index, generation);
  return {true, consumer, consumers_[consumer]->BatchInProgress(index)};
}

void RuntimeImpl::FenceRetired(const TeardownState* ending, uint32_t qp_num, const void* qp,
                               CqRecord* const cqs[2], const uint32_t commits[2]) {
  // What the QP may still have in each CQ is fenced until it has been polled (fences.h). A drained
  // teardown left nothing: its markers were polled, and an SRQ QP's LAST_WQE_REACHED (or the
  // fence standing in for it) came behind its receives. A teardown that started nothing (a QP in
  // RESET, a failed device) has nothing to wait for either.
  const bool plain = ending == nullptr;
  if (!plain && (ending->markers == 0 || ending->Flushed())) return;
  const uint32_t seen = plain ? 0 : ending->seen.load(std::memory_order_acquire);
  Shard::RetiredSide send{cqs[0], TeardownState::kSendMarker, 0, plain, commits[0], qp};
  Shard::RetiredSide recv{cqs[1], TeardownState::kRecvMarker, 0, plain, commits[1], qp};
  if (!plain) {
    send.marker = ending->send_marker();
    recv.marker = ending->recv_marker();
    // A receive side no marker stands behind: the marker never found room in the queue, or an
    // SRQ QP's, unless LAST_WQE_REACHED (or its stand-in) came behind its receives.
    recv.unfenced = ending->srq ? (seen & TeardownState::kLastWqe) == 0
                                : (ending->markers & TeardownState::kRecvMarker) == 0;
  }
  if (send.cq != nullptr && send.cq == recv.cq) {
    const Shard::RetiredSide both[2] = {send, recv};
    pollers_[send.cq->shard]->FenceRetired(ending, qp_num, both, 2);
    return;
  }
  if (send.cq != nullptr) pollers_[send.cq->shard]->FenceRetired(ending, qp_num, &send, 1);
  if (recv.cq != nullptr) pollers_[recv.cq->shard]->FenceRetired(ending, qp_num, &recv, 1);
}

bool RuntimeImpl::Unregister(uint32_t index, uint32_t generation) noexcept {
  if (CallerRoles() & kRefusedControlCallers) return false;  // as CheckCaller refuses
  ControlLock lock(mu_);
  const BatchTicket batch = Retire(index, generation, nullptr);
  if (!batch.retired) return true;  // already gone
  ChaosPoint();
  if (batch.seq != 0) {
    lock.Unlock();  // a handler in that batch may want mu_
    while (!consumers_[batch.consumer]->BatchOver(batch.seq)) WaitStep();  // thread_role.h
    lock.Lock();
  }
  slots_.Free(index);
  lock.Unlock();
  // After Shutdown: CM events it handed on (cm_router.h), now, or after the batch of the handler
  // calling this.
  events_->cm().held().DeliverAllOrAfterBatch();
  return true;
}

BatchTicket RuntimeImpl::RetireTeardown(TeardownState& state) noexcept {
  ControlLock lock(mu_);
  return Retire(state.slot, state.generation, &state);
}

bool RuntimeImpl::BatchOver(const BatchTicket& ticket) const noexcept {
  return consumers_[ticket.consumer]->BatchOver(ticket.seq);
}

void RuntimeImpl::FreeSlot(uint32_t index) noexcept {
  ControlLock lock(mu_);
  slots_.Free(index);
}

bool RuntimeImpl::RedriveFlush(const TeardownState& state) noexcept {
  ControlLock lock(mu_);
  const Slot& slot = slots_.slot(state.slot);
  if (!StateLiveAs(slot.state.load(std::memory_order_relaxed), state.generation)) return false;
  DeviceRecord* device = devices_[state.device - 1].get();
  return device->backend
      ->RedriveFlush(slot.qp.load(std::memory_order_relaxed),
                     state.recv_marker_owed ? state.recv_marker() : 0)
      .ok();
}

void RuntimeImpl::PostLastWqeStandIn(const TeardownState& state) noexcept {
  const Slot& slot = slots_.slot(state.slot);
  if (StateGeneration(slot.state.load(std::memory_order_acquire)) != state.generation) return;
  AsyncEvent fence;
  fence.type = IBV_EVENT_QP_LAST_WQE_REACHED;
  fence.qp_num = slot.qp_num.load(std::memory_order_relaxed);
  fence.device = slot.device.load(std::memory_order_relaxed);
  std::vector<Shard*> pollers;
  for (auto& p : pollers_) pollers.push_back(p.get());
  PostQpEvent(slots_, pollers, state.slot, fence, fence.device, /*stand_in=*/true);
}

Result<std::shared_ptr<TeardownState>> RuntimeImpl::TeardownQp(uint32_t index, uint32_t generation,
                                                               const TeardownOptions& options) {
  if (Status refused = CheckCaller("TeardownQp"); !refused.ok()) return refused;
  if (options.timeout.count() <= 0) return InvalidArgument("TeardownQp: timeout must be > 0");
  if (options.last_wqe_grace.count() < 0) {
    return InvalidArgument("TeardownQp: last_wqe_grace must not be negative");
  }
  ControlLock lock(mu_);
  if (shut_down_) return FailedPrecondition("TeardownQp: the runtime is shut down");
  Slot& slot = slots_.slot(index);
  const uint64_t state = slot.state.load(std::memory_order_relaxed);
  if (!StateLiveAs(state, generation)) {
    return InvalidArgument("TeardownQp: the registration is no longer live");
  }
  if (StateTearingDown(state)) return FailedPrecondition("TeardownQp: already tearing down");
  DeviceRecord* device = devices_[slot.device.load(std::memory_order_relaxed) - 1].get();
  auto teardown = std::make_shared<TeardownState>();
  teardown->worker = teardowns_.get();
  teardown->slot = index;
  teardown->generation = generation;
  teardown->qp_num = slot.qp_num.load(std::memory_order_relaxed);
  teardown->device = device->id;
  teardown->deadline = TeardownState::After(TeardownState::Clock::now(), options.timeout);
  teardown->last_wqe_grace = options.last_wqe_grace;
  teardown->on_done = options.on_done;
  // Teardown::Wait refuses the runtime's engine threads, whatever the teardown needs (runtime.h).
  teardown->engine_threads = &engine_threads_;
  if (device->failed.load(std::memory_order_acquire)) {
    // Nothing flushes on a dead device: unregister at once (on the teardown thread).
    teardown->end_with = Unavailable("TeardownQp: device " + device->backend->name() +
                                     " has failed; unregistered without draining");
    teardowns_->Add(teardown);
    return teardown;
  }
  // Tearing down before the markers exist, so that the pollers recognize them.
  const uint32_t consumer = StateConsumer(state);
  slot.teardown.store(teardown.get(), std::memory_order_relaxed);
  const uint32_t epoch = slot.teardown_epoch.load(std::memory_order_relaxed) + 1;
  slot.teardown_epoch.store(epoch == 0 ? 1 : epoch, std::memory_order_relaxed);
  slot.state.store(MakeState(generation, consumer, true, /*draining=*/true),
                   std::memory_order_seq_cst);
  Result<backend::FlushStart> posted = device->backend->StartQpFlush(
      slot.qp.load(std::memory_order_relaxed), teardown->send_marker(), teardown->recv_marker());
  if (!posted.ok()) {
    // No marker went out. Back to live; a batch that saw `tearing_down` may still read the state
    // through slot.teardown: wait for it (without mu_, as Unregister does) before it goes.
    slot.state.store(state, std::memory_order_seq_cst);
    lock.Unlock();
    consumers_[consumer]->WaitForBatchInProgress(index);
    lock.Lock();
    if (slot.teardown.load(std::memory_order_relaxed) == teardown.get()) {
      slot.teardown.store(nullptr, std::memory_order_release);
    }
    return Status(posted.status().code(), "TeardownQp: " + posted.status().message());
  }
  Result<backend::QpCaps> caps = device->backend->QueryQp(slot.qp.load(std::memory_order_relaxed));
  // An SRQ QP has no receive marker: its receive side is known to be flushed by LAST_WQE_REACHED
  // or the fence that stands in for it. A receive marker that found the queue full is posted again
  // by the teardown thread once the flushes have made room (TeardownHost::RedriveFlush).
  teardown->srq = caps.ok() && caps->srq;
  if (*posted == backend::FlushStart::kNothingOutstanding) {
    teardown->end_with = Status::Ok();
  } else {
    teardown->markers = TeardownState::kSendMarker;
    if (!teardown->srq && *posted == backend::FlushStart::kAllMarkers) {
      teardown->markers |= TeardownState::kRecvMarker;
    }
    teardown->recv_marker_owed = !teardown->srq && *posted == backend::FlushStart::kSendMarkerOnly;
  }
  teardowns_->Add(teardown);
  return teardown;
}

}  // namespace cqd::internal
