// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/runtime_cqs.cc: RuntimeImpl's devices, CM channels and CQs
// (runtime_impl.h): adding and finding devices, watching CM channels, creating, adopting and
// destroying CQs, and the capacity guard's commitments.
#include <algorithm>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/mutex.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"
#include "runtime/core/runtime_impl.h"

namespace cqd::internal {

Result<DeviceId> RuntimeImpl::AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                                        DeviceEventHandler* events) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(mu_);
  for (auto& d : devices_) {
    if (d->backend->kind() == device->kind() && d->backend->native() == device->native()) {
      return AlreadyExists(std::string(op) + ": " + device->name() +
                           " was already added as device " + std::to_string(d->id));
    }
  }
  if (shut_down_) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  auto record = std::make_unique<DeviceRecord>();
  if (!record->claim.Take(device->native())) {  // device_claims.h
    return AlreadyExists(std::string(op) + ": " + device->name() +
                         " was added to another runtime of this process, which reads its async "
                         "events (a device belongs to one runtime until that runtime is "
                         "destroyed)");
  }
  record->id = static_cast<DeviceId>(devices_.size() + 1);
  record->backend = std::move(device);
  record->handler = events;
  Status status;
  for (int shard = 0; shard < options_.pollers && status.ok(); ++shard) {
    Result<backend::Channel*> channel = record->backend->CreateChannel();
    if (channel.ok()) {
      record->channels.push_back(*channel);
    } else {
      status = channel.status();
    }
  }
  if (status.ok()) events_->RunSync([&] { status = events_->WatchDevice(record.get()); });
  if (!status.ok()) {
    for (backend::Channel* channel : record->channels) {
      (void)record->backend->DestroyChannel(channel);
    }
    return Status(status.code(),
                  std::string(op) + ": " + record->backend->name() + ": " + status.message());
  }
  devices_.push_back(std::move(record));
  const DeviceRecord& added = *devices_.back();
  if (log_.enabled()) {
    log_.Info("device " + added.backend->name() + " added as device " + std::to_string(added.id) +
              " (" + std::to_string(options_.pollers) + " channels)");
  }
  // NUMA placement (placement.h). Under mu_ with shut_down_ false: no thread has been joined.
  Placement::Threads threads;
  for (auto& poller : pollers_) threads.pollers.push_back(poller->native_thread());
  for (auto& consumer : consumers_) threads.consumers.push_back(consumer->native_thread());
  placement_.OnDeviceAdded(added.id, added.backend->name(), added.backend->in_sysfs(),
                           added.backend->comp_vectors(), threads);
  return added.id;
}

Result<void*> RuntimeImpl::DeviceNative(const char* op, DeviceId id, backend::Kind kind) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(mu_);
  if (id < 1 || id > devices_.size())
    return NotFound(std::string(op) + ": no device " + std::to_string(id));
  const backend::Device& device = *devices_[id - 1]->backend;
  if (device.kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + std::to_string(id) + " (" +
                           device.name() + ") is not of the kind this call takes");
  }
  return device.native();
}

Result<DeviceId> RuntimeImpl::FindDevice(const char* op, backend::Kind kind, void* native) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(mu_);
  for (auto& d : devices_) {
    if (d->backend->kind() == kind && d->backend->native() == native) return d->id;
  }
  return NotFound(std::string(op) + ": no device was added with this context (AddVerbsDevice)");
}

Status RuntimeImpl::WatchCmChannel(rdma_event_channel* channel, CmHandler& handler,
                                   ConsumerId consumer) {
  if (Status refused = CheckCaller("WatchCmChannel"); !refused.ok()) return refused;
  if (channel == nullptr) return InvalidArgument("WatchCmChannel: channel is null");
  ControlLock lock(mu_);
  if (shut_down_) return FailedPrecondition("WatchCmChannel: the runtime is shut down");
  if (consumer >= consumers_.size()) {
    return InvalidArgument("WatchCmChannel: consumer " + std::to_string(consumer) +
                           " is not in 0.." + std::to_string(consumers_.size() - 1));
  }
  const ConsumerOptions& c = options_.consumers[consumer];
  const int64_t limit = static_cast<int64_t>(c.queue_capacity + c.spill_capacity);
  Status status;
  events_->RunSync([&] { status = events_->WatchCm(channel, &handler, consumer, limit); });
  return status;
}

Status RuntimeImpl::UnwatchCmChannel(rdma_event_channel* channel) {
  if (Status refused = CheckCaller("UnwatchCmChannel"); !refused.ok()) return refused;
  if (channel == nullptr) return InvalidArgument("UnwatchCmChannel: channel is null");
  ControlLock lock(mu_);
  Status status;
  events_->RunSync([&] { status = events_->UnwatchCm(channel); });
  return status;
}

bool RuntimeImpl::BindCm(rdma_cm_id* id, const RegisteredQp& registration) {
  ControlLock lock(mu_);
  bool bound = false;
  events_->RunSync(
      [&] { bound = events_->cm().Bind(id, registration.slot, registration.generation); });
  lock.Unlock();
  // A Shutdown since RegisterQp: what Bind's sweep handed on to a closed consumer runs here (or
  // after the batch of the handler calling this).
  events_->cm().held().DeliverAllOrAfterBatch();
  return bound;
}

Result<DeviceRecord*> RuntimeImpl::FindShard(const char* op, DeviceId id, int shard) {
  if (shut_down_) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  if (id < 1 || id > devices_.size()) {
    return NotFound(std::string(op) + ": no device " + std::to_string(id));
  }
  if (shard < 0 || shard >= options_.pollers) {
    return InvalidArgument(std::string(op) + ": shard " + std::to_string(shard) + " is not in 0.." +
                           std::to_string(options_.pollers - 1));
  }
  DeviceRecord* device = devices_[id - 1].get();
  if (device->failed.load(std::memory_order_acquire)) {
    return Unavailable(std::string(op) + ": device " + device->backend->name() + " has failed");
  }
  return device;
}

Result<PolledCq> RuntimeImpl::CreateCq(DeviceId id, int shard, const CqOptions& options) {
  if (Status refused = CheckCaller("CreateCq"); !refused.ok()) return refused;
  ControlLock lock(mu_);
  Result<DeviceRecord*> device = FindShard("CreateCq", id, shard);
  if (!device.ok()) return device.status();
  if (options.depth < 1) {
    return InvalidArgument("CreateCq: depth " + std::to_string(options.depth) +
                           " must be at least 1");
  }
  Result<int> vector = placement_.CompVector(id, options.comp_vector);
  if (!vector.ok()) return InvalidArgument("CreateCq: " + vector.status().message());
  Result<backend::Cq*> cq =
      (*device)->backend->CreateCq(options.depth, (*device)->channels[shard], *vector);
  if (!cq.ok()) return cq.status();
  auto record = std::make_unique<CqRecord>();
  record->device = *device;
  record->shard = shard;
  record->cq = *cq;
  record->solicited_only = options.solicited_only;
  record->grow = options.grow;
  record->comp_vector = *vector;
  return AddCq(std::move(record));
}

Result<void*> RuntimeImpl::NativeChannel(const char* op, DeviceId id, int shard,
                                         backend::Kind kind) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(mu_);
  Result<DeviceRecord*> device = FindShard(op, id, shard);
  if (!device.ok()) return device.status();
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + std::to_string(id) + " (" +
                           (*device)->backend->name() + ") is not of the kind this call takes");
  }
  return (*device)->channels[shard]->native();
}

Result<PolledCq> RuntimeImpl::AdoptCq(DeviceId id, int shard, backend::Kind kind, void* native,
                                      const CqOptions& options) {
  if (Status refused = CheckCaller("AdoptCq"); !refused.ok()) return refused;
  ControlLock lock(mu_);
  Result<DeviceRecord*> device = FindShard("AdoptCq", id, shard);
  if (!device.ok()) return device.status();
  if (native == nullptr) return InvalidArgument("AdoptCq: cq is null");
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument("AdoptCq: the CQ's kind does not match device " + std::to_string(id));
  }
  if (cqs_.FindNative(native) != nullptr) {
    return AlreadyExists("AdoptCq: the CQ is already polled by this runtime");
  }
  Result<backend::Cq*> cq = (*device)->backend->AdoptCq(native, (*device)->channels[shard]);
  if (!cq.ok()) return cq.status();
  auto record = std::make_unique<CqRecord>();
  record->device = *device;
  record->shard = shard;
  record->cq = *cq;
  record->adopted = true;
  record->solicited_only = options.solicited_only;
  record->grow = options.grow;
  return AddCq(std::move(record));
}

Result<PolledCq> RuntimeImpl::AddCq(std::unique_ptr<CqRecord> record) {
  record->native = record->cq->native();
  CqRecord* cq = cqs_.Add(std::move(record));
  // Map before the poller can arm it, so that its first event is already known.
  events_->RunSync([&] { events_->MapCq(cq); });
  pollers_[cq->shard]->AddCq(cq);
  return PolledCq{serial_,   cq->id, cq->shard, cq->device->id, cq->device->backend->kind(),
                  cq->native};
}

Status RuntimeImpl::DestroyCq(uint64_t runtime, uint32_t id) {
  if (Status refused = CheckCaller("DestroyCq"); !refused.ok()) return refused;
  ControlLock lock(mu_);
  if (id == 0) return InvalidArgument("DestroyCq: the handle is empty");
  if (runtime != serial_) {
    return InvalidArgument("DestroyCq: CQ " + std::to_string(id) +
                           " was created or adopted by another runtime");
  }
  CqRecord* cq = cqs_.Find(id);
  if (cq == nullptr) {
    return NotFound("DestroyCq: no CQ " + std::to_string(id) + " (already destroyed or released)");
  }
  if (cq->registered_qps > 0) {
    return FailedPrecondition("DestroyCq: CQ " + std::to_string(cq->id) + " still has " +
                              std::to_string(cq->registered_qps) + " registered QP uses");
  }
  // From here the poller neither polls nor arms it; what the CQ still holds went to the orphan
  // sink. Flush the acks (see CqRecord::retiring).
  pollers_[cq->shard]->RemoveCq(cq);
  cq->retiring.store(true, std::memory_order_seq_cst);
  cq->Ack(cq->acks.TakeAll());
  if (cq->adopted) {
    // Keep the record mapped: an event still in flight for it gets acked by the event thread
    // rather than leaving the engine's ibv_destroy_cq waiting forever. Its counters stay live
    // in GetStats (CqTable::Release).
    cq->device->backend->ReleaseCq(cq->cq);
    pollers_[cq->shard]->DropFences(cq);
    // Let an event the event thread is handling for it finish (and be acked), so that the totals
    // balance when this returns.
    events_->RunSync([] {});
    cqs_.Release(id);
    return Status::Ok();
  }
  if (Status s = cq->device->backend->DestroyCq(cq->cq); !s.ok()) {
    // Still alive: poll it again. An event read while it was retiring was acked without
    // clearing `armed`; clear it so the poller re-arms it.
    cq->retiring.store(false, std::memory_order_seq_cst);
    cq->armed.store(false, std::memory_order_seq_cst);
    pollers_[cq->shard]->ReturnCq(cq);
    return Status(s.code(), "DestroyCq: " + s.message());
  }
  pollers_[cq->shard]->DropFences(cq);  // gone for good: nothing more comes out of it
  events_->RunSync([&] { events_->UnmapCq(cq); });
  cqs_.Erase(id);
  return Status::Ok();
}

Status RuntimeImpl::Commit(CqRecord* cq, uint64_t wrs, uint32_t qp_num) {
  // Retired QPs' fences (fences.h) still count: what they stand for may be in the CQ.
  uint64_t need = cq->committed + cq->leftover_commit.load(std::memory_order_acquire) + wrs;
  const int depth = cq->cq->depth();
  if (need > static_cast<uint64_t>(depth) && cq->fences.load(std::memory_order_relaxed) != 0) {
    // Before growing or refusing: fences whose catch-up can end now give their share back.
    pollers_[cq->shard]->SettleFences(cq);
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
  Status s = pollers_[cq->shard]->ResizeCq(cq, static_cast<int>(target));
  if (!s.ok() && target > need) s = pollers_[cq->shard]->ResizeCq(cq, static_cast<int>(need));
  if (!s.ok()) return ResourceExhausted(what + "; growing it failed: " + s.message());
  return Status::Ok();
}

}  // namespace cqd::internal
