// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/control/cqs.h"

#include <atomic>
#include <string>

#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {
namespace {

std::atomic<uint64_t> next_runtime_serial{1};

}  // namespace

Cqs::Cqs(ControlCore& core, const Devices& devices, Placement& placement)
    : core_(core),
      devices_(devices),
      placement_(placement),
      serial_(next_runtime_serial.fetch_add(1, std::memory_order_relaxed)) {}

Result<DeviceRecord*> Cqs::FindShard(const char* op, DeviceId id, int shard) {
  if (core_.shut_down) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  if (id < 1 || id > devices_.size()) {
    return NotFound(std::string(op) + ": no device " + std::to_string(id));
  }
  if (shard < 0 || shard >= core_.options.pollers) {
    return InvalidArgument(std::string(op) + ": shard " + std::to_string(shard) + " is not in 0.." +
                           std::to_string(core_.options.pollers - 1));
  }
  DeviceRecord* device = devices_.record(id);
  if (device->failed.load(std::memory_order_acquire)) {
    return Unavailable(std::string(op) + ": device " + device->backend->name() + " has failed");
  }
  return device;
}

Result<PolledCq> Cqs::CreateCq(DeviceId id, int shard, const CqOptions& options) {
  if (Status refused = CheckCaller("CreateCq"); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
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

Result<void*> Cqs::NativeChannel(const char* op, DeviceId id, int shard, backend::Kind kind) {
  if (Status refused = CheckCaller(op); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  Result<DeviceRecord*> device = FindShard(op, id, shard);
  if (!device.ok()) return device.status();
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + std::to_string(id) + " (" +
                           (*device)->backend->name() + ") is not of the kind this call takes");
  }
  return (*device)->channels[shard]->native();
}

Result<PolledCq> Cqs::AdoptCq(DeviceId id, int shard, backend::Kind kind, void* native,
                              const CqOptions& options) {
  if (Status refused = CheckCaller("AdoptCq"); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  Result<DeviceRecord*> device = FindShard("AdoptCq", id, shard);
  if (!device.ok()) return device.status();
  if (native == nullptr) return InvalidArgument("AdoptCq: cq is null");
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument("AdoptCq: the CQ's kind does not match device " + std::to_string(id));
  }
  if (table_.FindNative(native) != nullptr) {
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

Result<PolledCq> Cqs::AddCq(std::unique_ptr<CqRecord> record) {
  record->native = record->cq->native();
  CqRecord* cq = table_.Add(std::move(record));
  // Map before the poller can arm it, so that its first event is already known.
  core_.events->RunSync([&] { core_.events->MapCq(cq); });
  core_.pollers[cq->shard]->AddCq(cq);
  return PolledCq{serial_,   cq->id, cq->shard, cq->device->id, cq->device->backend->kind(),
                  cq->native};
}

Status Cqs::DestroyCq(uint64_t runtime, uint32_t id) {
  if (Status refused = CheckCaller("DestroyCq"); !refused.ok()) return refused;
  ControlLock lock(core_.mu);
  if (id == 0) return InvalidArgument("DestroyCq: the handle is empty");
  if (runtime != serial_) {
    return InvalidArgument("DestroyCq: CQ " + std::to_string(id) +
                           " was created or adopted by another runtime");
  }
  CqRecord* cq = table_.Find(id);
  if (cq == nullptr) {
    return NotFound("DestroyCq: no CQ " + std::to_string(id) + " (already destroyed or released)");
  }
  if (cq->registered_qps > 0) {
    return FailedPrecondition("DestroyCq: CQ " + std::to_string(cq->id) + " still has " +
                              std::to_string(cq->registered_qps) + " registered QP uses");
  }
  // From here the poller neither polls nor arms it; what the CQ still holds went to the orphan
  // sink. Flush the acks (see CqRecord::retiring).
  core_.pollers[cq->shard]->RemoveCq(cq);
  cq->retiring.store(true, std::memory_order_seq_cst);
  cq->Ack(cq->acks.TakeAll());
  if (cq->adopted) {
    // Keep the record mapped: an event still in flight for it gets acked by the event thread
    // rather than leaving the engine's ibv_destroy_cq waiting forever. Its counters stay live
    // in GetStats (CqTable::Release).
    cq->device->backend->ReleaseCq(cq->cq);
    core_.pollers[cq->shard]->DropFences(cq);
    // Let an event the event thread is handling for it finish (and be acked), so that the totals
    // balance when this returns.
    core_.events->RunSync([] {});
    table_.Release(id);
    return Status::Ok();
  }
  if (Status s = cq->device->backend->DestroyCq(cq->cq); !s.ok()) {
    // Still alive: poll it again. An event read while it was retiring was acked without
    // clearing `armed`; clear it so the poller re-arms it.
    cq->retiring.store(false, std::memory_order_seq_cst);
    cq->armed.store(false, std::memory_order_seq_cst);
    core_.pollers[cq->shard]->ReturnCq(cq);
    return Status(s.code(), "DestroyCq: " + s.message());
  }
  core_.pollers[cq->shard]->DropFences(cq);  // gone for good: nothing more comes out of it
  core_.events->RunSync([&] { core_.events->UnmapCq(cq); });
  table_.Erase(id);
  return Status::Ok();
}

void Cqs::FillStats(Stats& stats) const {
  ControlLock lock(core_.mu);
  table_.FillStats(stats);
}

}  // namespace cqd::internal
