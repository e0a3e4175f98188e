// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/registrations.h"

#include <algorithm>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {

Result<RegisteredQp> Registrations::RegisterQp(uint32_t qp_num, void* native_qp, void* send_native,
                                               void* recv_native, QpHandler& handler,
                                               ConsumerId consumer, const QpOptions& options) {
  if (Status refused = CheckCaller("RegisterQp"); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  if (core_.shut_down) return FailedPrecondition("RegisterQp: the runtime is shut down");
  if (consumer >= core_.consumers.size()) {
    return InvalidArgument("RegisterQp: consumer " + std::to_string(consumer) + " is not in 0.." +
                           std::to_string(core_.consumers.size() - 1));
  }
  if (qp_num > 0xffffff) return InvalidArgument("RegisterQp: qp_num exceeds 24 bits");
  CqRecord* send = cqs_->FindNative(send_native);
  CqRecord* recv = cqs_->FindNative(recv_native);
  if (send == nullptr || recv == nullptr) {
    return NotFound("RegisterQp: qp_num " + std::to_string(qp_num) + ": its " +
                    (send == nullptr ? "send" : "recv") + " CQ is not polled by this runtime");
  }
  if (send->device != recv->device) {
    return InvalidArgument("RegisterQp: send and recv CQs belong to different devices");
  }
  if (const ConsumerOptions& c = core_.options.consumers[consumer];
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
        !core_.pollers[cq->shard]->FenceForReuse(cq, qp_num, in_error_qp, retired_here)) {
      Status refused = Unavailable(
          "RegisterQp: qp_num " + std::to_string(qp_num) + ": CQ " + std::to_string(cq->id) +
          " still holds completions of a retired QP that had this number, and a consumer it "
          "serves is too full for the runtime to poll them out now "
          "(ConsumerStats::spill_depth), or (a QP in the error state) that QP's teardown "
          "markers have not come back yet; register again later");
      if (core_.log.enabled()) core_.log.Debug(refused.message());
      return refused;
    }
  }
  if (send == recv) {
    if (Status s = Commit(send, send_wrs + recv_wrs, qp_num); !s.ok()) return s;
  } else {
    if (Status s = Commit(send, send_wrs, qp_num); !s.ok()) return s;
    if (Status s = Commit(recv, recv_wrs, qp_num); !s.ok()) return s;
  }
  int64_t index = core_.slots.Allocate();
  if (index == -1) {
    return ResourceExhausted("RegisterQp: all " + std::to_string(core_.slots.capacity()) +
                             " registrations (max_registrations) are in use");
  }
  if (index < 0) return ResourceExhausted("RegisterQp: out of memory for registration slots");
  Slot& slot = core_.slots.slot(static_cast<uint32_t>(index));
  const uint32_t generation = slot.control.generation;  // the one its last Retire published
  slot.handler.store(&handler, std::memory_order_relaxed);
  slot.qp_num.store(qp_num, std::memory_order_relaxed);
  slot.device.store(device->id, std::memory_order_relaxed);
  slot.send_cq.store(send->id, std::memory_order_relaxed);
  slot.recv_cq.store(recv->id, std::memory_order_relaxed);
  slot.send_shard.store(static_cast<uint16_t>(send->shard), std::memory_order_relaxed);
  slot.recv_shard.store(static_cast<uint16_t>(recv->shard), std::memory_order_relaxed);
  slot.qp.store(native_qp, std::memory_order_relaxed);
  slot.teardown.store(nullptr, std::memory_order_relaxed);
  slot.control.send_commit = static_cast<uint32_t>(send_wrs);
  slot.control.recv_commit = static_cast<uint32_t>(recv_wrs);
  send->committed += send_wrs;
  recv->committed += recv_wrs;
  // The pollers learn which consumer the CQs serve before the first completion can be routed.
  core_.pollers[send->shard]->AddUse(send, consumer);
  if (recv != send) core_.pollers[recv->shard]->AddUse(recv, consumer);
  slot.Publish(generation, consumer, /*live=*/true, /*tearing_down=*/false,
               std::memory_order_release);
  device->qps.Set(qp_num, &slot);
  send->retired.Remove(qp_num);  // polled out above: what the old QP left is gone
  recv->retired.Remove(qp_num);
  ++send->registered_qps;
  ++recv->registered_qps;
  live_.fetch_add(1, std::memory_order_relaxed);
  return RegisteredQp{static_cast<uint32_t>(index), generation, qp_num};
}

Status Registrations::Commit(CqRecord* cq, uint64_t wrs, uint32_t qp_num) {
  // Retired QPs' fences (fences.h) still count: what they stand for may be in the CQ.
  uint64_t need = cq->committed + cq->leftover_commit.load(std::memory_order_acquire) + wrs;
  const int depth = cq->cq->depth();
  if (need > static_cast<uint64_t>(depth) && cq->fences.load(std::memory_order_relaxed) != 0) {
    // Before growing or refusing: fences whose catch-up can end now give their share back.
    core_.pollers[cq->shard]->SettleFences(cq);
    need = cq->committed + cq->leftover_commit.load(std::memory_order_acquire) + wrs;
  }
  if (need <= static_cast<uint64_t>(depth)) return Status::Ok();
  const std::string what = "RegisterQp: qp_num " + std::to_string(qp_num) + ": CQ " +
                           std::to_string(cq->id) + " (depth " + std::to_string(depth) +
                           ") cannot hold the " + std::to_string(need) +
                           " work requests its QPs may have outstanding (S11)";
  if (!cq->grow) return ResourceExhausted(what + "; it was created with grow = false");
  if (need > kCqGrowthCeiling) return ResourceExhausted(what);
  // Grow with headroom, so that a run of registrations does not resize every time.
  const uint64_t target =
      std::max<uint64_t>(need, std::min<uint64_t>(2 * uint64_t(depth), need + need / 2));
  Status s = core_.pollers[cq->shard]->ResizeCq(cq, static_cast<int>(target));
  if (!s.ok() && target > need) s = core_.pollers[cq->shard]->ResizeCq(cq, static_cast<int>(need));
  if (!s.ok()) return ResourceExhausted(what + "; growing it failed: " + s.message());
  return Status::Ok();
}

CallTicket Registrations::Retire(uint32_t index, uint32_t generation, TeardownState* ending) {
  Slot& slot = core_.slots.slot(index);
  if (!slot.control.LiveAs(generation)) return {};  // not retired
  const uint32_t consumer = slot.control.consumer;
  const uint32_t send_id = slot.send_cq.load(std::memory_order_relaxed);
  const uint32_t recv_id = slot.recv_cq.load(std::memory_order_relaxed);
  const uint32_t ids[2] = {send_id, recv_id};
  const uint32_t commits[2] = {slot.control.send_commit, slot.control.recv_commit};
  CqRecord* cqs[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; ++k) {
    cqs[k] = cqs_->Find(ids[k]);
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
  slot.Publish(generation + 1, consumer, /*live=*/false, /*tearing_down=*/false,
               std::memory_order_seq_cst);
  ChaosPoint();
  if (ending == nullptr) FenceRetired(nullptr, qp_num, qp, cqs, commits);
  live_.fetch_sub(1, std::memory_order_relaxed);
  DeviceRecord* device = devices_.record(slot.device.load(std::memory_order_relaxed));
  if (device->qps.Lookup(qp_num) == &slot) device->qps.Clear(qp_num);
  for (int k = 0; k < 2; ++k) {
    CqRecord* cq = cqs[k];
    if (cq == nullptr) continue;
    --cq->registered_qps;
    cq->committed -= commits[k];
    if (k == 1 && recv_id == send_id) continue;  // one CQ for both: one use
    core_.pollers[cq->shard]->DropUse(cq, consumer);
  }
  slot.teardown.store(nullptr, std::memory_order_release);
  // What the pollers still hold for this registration becomes orphans now, so that a consumer
  // that stopped draining does not keep CQs of others held back for QPs that are gone.
  for (uint16_t shard : {slot.send_shard.load(std::memory_order_relaxed),
                         slot.recv_shard.load(std::memory_order_relaxed)}) {
    core_.pollers[shard]->PurgeDead(consumer);
  }
  // Its connection events still on their way go to the CmHandler now, in read order, wherever
  // their parts wait (cm_router.h); they run there, or in HeldEvents after Shutdown.
  core_.events->cm().Ended(index, generation);
  return {true, consumer, core_.consumers[consumer]->CallInProgress(index)};
}

void Registrations::FenceRetired(const TeardownState* ending, uint32_t qp_num, const void* qp,
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
    core_.pollers[send.cq->shard]->FenceRetired(ending, qp_num, both, 2);
    return;
  }
  if (send.cq != nullptr) core_.pollers[send.cq->shard]->FenceRetired(ending, qp_num, &send, 1);
  if (recv.cq != nullptr) core_.pollers[recv.cq->shard]->FenceRetired(ending, qp_num, &recv, 1);
}

bool Registrations::Unregister(uint32_t index, uint32_t generation) noexcept {
  if (CallerRoles() & kRefusedControlCallers) return false;  // as CheckCaller refuses
  ControlLock lock(core_.mu);
  const CallTicket call = Retire(index, generation, nullptr);
  if (!call.retired) return true;  // already gone
  ChaosPoint();
  if (call.call != 0) {
    lock.Unlock();  // that handler may want core.mu
    while (!core_.consumers[call.consumer]->CallOver(call.call)) WaitStep();  // thread_role.h
    lock.Lock();
  }
  core_.slots.Free(index);
  lock.Unlock();
  // After Shutdown: CM events it handed on (cm_router.h), now, or after the batch of the handler
  // calling this.
  core_.events->cm().held().DeliverAllOrAfterBatch();
  return true;
}

CallTicket Registrations::RetireTeardown(TeardownState& state) noexcept {
  ControlLock lock(core_.mu);
  return Retire(state.slot, state.generation, &state);
}

bool Registrations::BindCm(rdma_cm_id* id, const RegisteredQp& registration) {
  ControlLock lock(core_.mu);
  bool bound = false;
  core_.events->RunSync(
      [&] { bound = core_.events->cm().Bind(id, registration.slot, registration.generation); });
  lock.Unlock();
  // A Shutdown since RegisterQp: what Bind's sweep handed on to a closed consumer runs here (or
  // after the batch of the handler calling this).
  core_.events->cm().held().DeliverAllOrAfterBatch();
  return bound;
}

}  // namespace cqd::internal
