// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/runtime_impl.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {
namespace {

std::string Str(long long v) { return std::to_string(v); }

// Control calls wait for pollers and the event thread while holding the runtime mutex, so they
// cannot be made from those threads (an OrphanHandler or a DeviceEventHandler).
#define CQD_REFUSE_ON_RUNTIME_THREAD(op)                                \
  do {                                                                  \
    if (Status refused = RuntimeImpl::CheckCaller(op); !refused.ok()) { \
      return refused;                                                   \
    }                                                                   \
  } while (0)

std::atomic<uint64_t> next_runtime_serial{1};

}  // namespace

Status RuntimeImpl::CheckCaller(const char* op, uint32_t refused) {
  const char* reason = RefusalReason(CallerRoles(), refused);
  if (reason == nullptr) return Status::Ok();
  return FailedPrecondition(std::string(op) + ": " + reason +
                            ", which must not make this call (runtime.h, \"Which threads may "
                            "block\")");
}

RuntimeImpl::RuntimeImpl(const RuntimeOptions& options)
    : options_(options),
      serial_(next_runtime_serial.fetch_add(1, std::memory_order_relaxed)),
      log_(options.log ? options.log : EnvironmentLogSink()),
      slots_(options.max_registrations),
      orphans_(options.orphan_handler) {
  std::vector<Consumer*> consumers;
  for (size_t i = 0; i < options_.consumers.size(); ++i) {
    ConsumerOptions c = options_.consumers[i];
    if (c.name.empty()) c.name = "consumer" + Str(i);
    consumers_.push_back(std::make_unique<Consumer>(static_cast<uint32_t>(i), c, slots_, orphans_,
                                                    options_.pollers));
    consumers.push_back(consumers_.back().get());
  }
  std::vector<Poller*> pollers;
  for (int i = 0; i < options_.pollers; ++i) {
    pollers_.push_back(std::make_unique<Poller>(i, options_, consumers, slots_, orphans_));
    pollers.push_back(pollers_.back().get());
  }
  events_ = std::make_unique<EventLoop>(options_.ack_threshold, pollers, slots_);
  teardowns_ = std::make_unique<TeardownWorker>(static_cast<TeardownHost&>(*this));
  events_->set_on_device_failed([this](DeviceId device) { teardowns_->DeviceFailed(device); });
  events_->set_logger(&log_);
  teardowns_->set_logger(&log_);
  if (log_.enabled()) {  // a consumer that holds its pollers back is said in the log
    stall_watch_ = std::make_unique<StallWatch>(log_, pollers_, consumers_);
    events_->set_tick([this] { stall_watch_->Tick(); });
  }
}

Status RuntimeImpl::Start() {
  for (auto& consumer : consumers_) {
    if (Status s = consumer->Start(); !s.ok()) return s;
  }
  if (Status s = events_->Start(); !s.ok()) return s;
  for (auto& poller : pollers_) {
    if (Status s = poller->Start(); !s.ok()) return s;
  }
  teardowns_->Start();
  if (!options_.stats_socket.empty() || !options_.stats_tcp.empty()) {
    const StatsEndpointOptions endpoint{options_.stats_socket, options_.stats_socket_mode,
                                        options_.stats_tcp, options_.stats_tcp_allow_remote,
                                        options_.stats_per_cq};
    auto server = StatsServer::Start(
        endpoint, [this] { return GetStats(); }, log_);
    if (!server.ok()) return server.status();
    stats_server_ = std::move(server).value();
  }
  return Status::Ok();
}

RuntimeImpl::~RuntimeImpl() {
  if (stats_server_ != nullptr) stats_server_->Stop();  // Shutdown may be refused here
  (void)Shutdown();
  for (auto& consumer : consumers_) consumer->OrphanRemaining();  // engine-driven leftovers
  // The threads are gone: poll every CQ empty (to the orphan sink), flush its unacked events
  // (S2) so destroy cannot hang, and destroy or release it.
  for (auto& [id, cq] : cqs_.live()) {
    pollers_[cq->shard]->RemoveCq(cq.get());
    cq->Ack(cq->acks.TakeAll());
    if (cq->adopted) {
      cq->device->backend->ReleaseCq(cq->cq);
    } else {
      (void)cq->device->backend->DestroyCq(cq->cq);  // fails only while the engine holds QPs
    }
  }
  for (auto& cq : cqs_.released()) cq->Ack(cq->acks.TakeAll());
  for (auto& device : devices_) {
    for (backend::Channel* channel : device->channels) {
      (void)device->backend->DestroyChannel(channel);
    }
  }
}

Result<DeviceId> RuntimeImpl::AddDevice(const char* op, std::unique_ptr<backend::Device> device,
                                        DeviceEventHandler* events) {
  CQD_REFUSE_ON_RUNTIME_THREAD(op);
  std::lock_guard<ControlMutex> lock(mu_);
  for (auto& d : devices_) {
    if (d->backend->kind() == device->kind() && d->backend->native() == device->native()) {
      return AlreadyExists(std::string(op) + ": " + device->name() +
                           " was already added as device " + Str(d->id));
    }
  }
  if (shut_down_) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  auto record = std::make_unique<DeviceRecord>();
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
    log_.Info("device " + added.backend->name() + " added as device " + Str(added.id) + " (" +
              Str(options_.pollers) + " channels)");
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
  CQD_REFUSE_ON_RUNTIME_THREAD(op);
  std::lock_guard<ControlMutex> lock(mu_);
  if (id < 1 || id > devices_.size()) return NotFound(std::string(op) + ": no device " + Str(id));
  const backend::Device& device = *devices_[id - 1]->backend;
  if (device.kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + Str(id) + " (" + device.name() +
                           ") is not of the kind this call takes");
  }
  return device.native();
}

Result<DeviceId> RuntimeImpl::FindDevice(const char* op, backend::Kind kind, void* native) {
  CQD_REFUSE_ON_RUNTIME_THREAD(op);
  std::lock_guard<ControlMutex> lock(mu_);
  for (auto& d : devices_) {
    if (d->backend->kind() == kind && d->backend->native() == native) return d->id;
  }
  return NotFound(std::string(op) + ": no device was added with this context (AddVerbsDevice)");
}

Status RuntimeImpl::WatchCmChannel(rdma_event_channel* channel, CmHandler& handler,
                                   ConsumerId consumer) {
  CQD_REFUSE_ON_RUNTIME_THREAD("WatchCmChannel");
  if (channel == nullptr) return InvalidArgument("WatchCmChannel: channel is null");
  std::lock_guard<ControlMutex> lock(mu_);
  if (shut_down_) return FailedPrecondition("WatchCmChannel: the runtime is shut down");
  if (consumer >= consumers_.size()) {
    return InvalidArgument("WatchCmChannel: consumer " + Str(consumer) + " is not in 0.." +
                           Str(consumers_.size() - 1));
  }
  const ConsumerOptions& c = options_.consumers[consumer];
  const int64_t limit = static_cast<int64_t>(c.queue_capacity + c.spill_capacity);
  Status status;
  events_->RunSync([&] { status = events_->WatchCm(channel, &handler, consumer, limit); });
  return status;
}

Status RuntimeImpl::UnwatchCmChannel(rdma_event_channel* channel) {
  CQD_REFUSE_ON_RUNTIME_THREAD("UnwatchCmChannel");
  if (channel == nullptr) return InvalidArgument("UnwatchCmChannel: channel is null");
  std::lock_guard<ControlMutex> lock(mu_);
  Status status;
  events_->RunSync([&] { status = events_->UnwatchCm(channel); });
  return status;
}

bool RuntimeImpl::BindCm(rdma_cm_id* id, const RegisteredQp& registration) {
  std::unique_lock<ControlMutex> lock(mu_);
  bool bound = false;
  events_->RunSync(
      [&] { bound = events_->cm().Bind(id, registration.slot, registration.generation); });
  lock.unlock();
  // A Shutdown since RegisterQp: what Bind's sweep handed on to a closed consumer runs here (or
  // after the batch of the handler calling this).
  events_->cm().held().DeliverAllOrAfterBatch();
  return bound;
}

Result<DeviceRecord*> RuntimeImpl::FindShard(const char* op, DeviceId id, int shard) {
  if (shut_down_) return FailedPrecondition(std::string(op) + ": the runtime is shut down");
  if (id < 1 || id > devices_.size()) {
    return NotFound(std::string(op) + ": no device " + Str(id));
  }
  if (shard < 0 || shard >= options_.pollers) {
    return InvalidArgument(std::string(op) + ": shard " + Str(shard) + " is not in 0.." +
                           Str(options_.pollers - 1));
  }
  DeviceRecord* device = devices_[id - 1].get();
  if (device->failed.load(std::memory_order_acquire)) {
    return Unavailable(std::string(op) + ": device " + device->backend->name() + " has failed");
  }
  return device;
}

Result<PolledCq> RuntimeImpl::CreateCq(DeviceId id, int shard, const CqOptions& options) {
  CQD_REFUSE_ON_RUNTIME_THREAD("CreateCq");
  std::lock_guard<ControlMutex> lock(mu_);
  Result<DeviceRecord*> device = FindShard("CreateCq", id, shard);
  if (!device.ok()) return device.status();
  if (options.depth < 1) {
    return InvalidArgument("CreateCq: depth " + Str(options.depth) + " must be at least 1");
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
  CQD_REFUSE_ON_RUNTIME_THREAD(op);
  std::lock_guard<ControlMutex> lock(mu_);
  Result<DeviceRecord*> device = FindShard(op, id, shard);
  if (!device.ok()) return device.status();
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument(std::string(op) + ": device " + Str(id) + " (" +
                           (*device)->backend->name() + ") is not of the kind this call takes");
  }
  return (*device)->channels[shard]->native();
}

Result<PolledCq> RuntimeImpl::AdoptCq(DeviceId id, int shard, backend::Kind kind, void* native,
                                      const CqOptions& options) {
  CQD_REFUSE_ON_RUNTIME_THREAD("AdoptCq");
  std::lock_guard<ControlMutex> lock(mu_);
  Result<DeviceRecord*> device = FindShard("AdoptCq", id, shard);
  if (!device.ok()) return device.status();
  if (native == nullptr) return InvalidArgument("AdoptCq: cq is null");
  if ((*device)->backend->kind() != kind) {
    return InvalidArgument("AdoptCq: the CQ's kind does not match device " + Str(id));
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
  CQD_REFUSE_ON_RUNTIME_THREAD("DestroyCq");
  std::lock_guard<ControlMutex> lock(mu_);
  if (id == 0) return InvalidArgument("DestroyCq: the handle is empty");
  if (runtime != serial_) {
    return InvalidArgument("DestroyCq: CQ " + Str(id) +
                           " was created or adopted by another runtime");
  }
  CqRecord* cq = cqs_.Find(id);
  if (cq == nullptr) {
    return NotFound("DestroyCq: no CQ " + Str(id) + " (already destroyed or released)");
  }
  if (cq->registered_qps > 0) {
    return FailedPrecondition("DestroyCq: CQ " + Str(cq->id) + " still has " +
                              Str(cq->registered_qps) + " registered QP uses");
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
  const std::string what = "RegisterQp: qp_num " + Str(qp_num) + ": CQ " + Str(cq->id) +
                           " (depth " + Str(depth) + ") cannot hold the " + Str(need) +
                           " work requests its QPs may have outstanding (S11)";
  if (!cq->grow) return ResourceExhausted(what + "; it was created with grow = false");
  if (need > (1u << 30)) return ResourceExhausted(what);
  // Grow with headroom, so that a run of registrations does not resize every time.
  const uint64_t target =
      std::max<uint64_t>(need, std::min<uint64_t>(2 * uint64_t(depth), need + need / 2));
  Status s = pollers_[cq->shard]->ResizeCq(cq, static_cast<int>(target));
  if (!s.ok() && target > need) s = pollers_[cq->shard]->ResizeCq(cq, static_cast<int>(need));
  if (!s.ok()) return ResourceExhausted(what + "; growing it failed: " + s.message());
  return Status::Ok();
}

Result<RegisteredQp> RuntimeImpl::RegisterQp(uint32_t qp_num, void* native_qp, void* send_native,
                                             void* recv_native, QpHandler& handler,
                                             ConsumerId consumer, const QpOptions& options) {
  CQD_REFUSE_ON_RUNTIME_THREAD("RegisterQp");
  std::lock_guard<ControlMutex> lock(mu_);
  if (shut_down_) return FailedPrecondition("RegisterQp: the runtime is shut down");
  if (consumer >= consumers_.size()) {
    return InvalidArgument("RegisterQp: consumer " + Str(consumer) + " is not in 0.." +
                           Str(consumers_.size() - 1));
  }
  if (qp_num > 0xffffff) return InvalidArgument("RegisterQp: qp_num exceeds 24 bits");
  CqRecord* send = cqs_.FindNative(send_native);
  CqRecord* recv = cqs_.FindNative(recv_native);
  if (send == nullptr || recv == nullptr) {
    return NotFound("RegisterQp: qp_num " + Str(qp_num) + ": its " +
                    (send == nullptr ? "send" : "recv") + " CQ is not polled by this runtime");
  }
  if (send->device != recv->device) {
    return InvalidArgument("RegisterQp: send and recv CQs belong to different devices");
  }
  if (const ConsumerOptions& c = options_.consumers[consumer];
      c.kind == ConsumerKind::kRunToCompletion &&
      (send->shard != c.poller || recv->shard != c.poller)) {
    return InvalidArgument("RegisterQp: consumer " + Str(consumer) +
                           " runs to completion on poller " + Str(c.poller) + ", but the QP's " +
                           (send->shard != c.poller ? "send" : "recv") + " CQ is on shard " +
                           Str(send->shard != c.poller ? send->shard : recv->shard));
  }
  DeviceRecord* device = send->device;
  if (device->qps.Lookup(qp_num) != nullptr) {
    return AlreadyExists("RegisterQp: qp_num " + Str(qp_num) + " is already registered");
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
  // A retired QP that had this number may still have completions in these CQs: the number is
  // registered there only once they have been polled out (fences.h), so none reaches this QP.
  for (CqRecord* cq : {send, recv}) {
    if (cq->fences.load(std::memory_order_relaxed) != 0 &&
        !pollers_[cq->shard]->FenceForReuse(cq, qp_num)) {
      Status refused = Unavailable(
          "RegisterQp: qp_num " + Str(qp_num) + ": CQ " + Str(cq->id) +
          " still holds completions of a retired QP that had this number, and a consumer it "
          "serves is too full for the runtime to poll them out now "
          "(ConsumerStats::spill_depth); register again once it drains");
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
    return ResourceExhausted("RegisterQp: all " + Str(slots_.capacity()) +
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
  }
  // A teardown's fences before the registration dies: a pass before this saw it live and
  // draining and marked what it polled; a pass after finds the fence first. (The other way round,
  // a pass in between would take a marker for nobody's and orphan it, and its fence would wait
  // for it in vain.) A plain Unregister has no markers: its fences come after the death, so that
  // the poller this wakes polls what the CQ still holds for nobody (the orphan sink, at once)
  // rather than for the QP's consumer.
  const uint32_t qp_num = slot.qp_num.load(std::memory_order_relaxed);
  if (ending != nullptr) FenceRetired(ending, qp_num, cqs, commits);
  ChaosPoint();  // fenced, still live: passes route to it meanwhile
  // Dead, with the next generation: items already routed with this one become orphans.
  slot.state.store(MakeState(generation + 1, consumer, false), std::memory_order_seq_cst);
  ChaosPoint();
  if (ending == nullptr) FenceRetired(nullptr, qp_num, cqs, commits);
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

void RuntimeImpl::FenceRetired(const TeardownState* ending, uint32_t qp_num, CqRecord* const cqs[2],
                               const uint32_t commits[2]) {
  // What the QP may still have in each CQ is fenced until it has been polled (fences.h). A drained
  // teardown left nothing: its markers were polled, and an SRQ QP's LAST_WQE_REACHED (or the
  // fence standing in for it) came behind its receives. A teardown that started nothing (a QP in
  // RESET, a failed device) has nothing to wait for either.
  const bool plain = ending == nullptr;
  if (!plain && (ending->markers == 0 || ending->Drained())) return;
  const uint32_t seen = plain ? 0 : ending->seen.load(std::memory_order_acquire);
  Poller::RetiredSide send{cqs[0], TeardownState::kSendMarker, 0, plain, commits[0]};
  Poller::RetiredSide recv{cqs[1], TeardownState::kRecvMarker, 0, plain, commits[1]};
  if (!plain) {
    send.marker = ending->send_marker();
    recv.marker = ending->recv_marker();
    // A receive side no marker stands behind: the marker never found room in the queue, or an
    // SRQ QP's, unless LAST_WQE_REACHED (or its stand-in) came behind its receives.
    recv.unfenced = ending->srq ? (seen & TeardownState::kLastWqe) == 0
                                : (ending->markers & TeardownState::kRecvMarker) == 0;
  }
  if (send.cq != nullptr && send.cq == recv.cq) {
    const Poller::RetiredSide both[2] = {send, recv};
    pollers_[send.cq->shard]->FenceRetired(ending, qp_num, both, 2);
    return;
  }
  if (send.cq != nullptr) pollers_[send.cq->shard]->FenceRetired(ending, qp_num, &send, 1);
  if (recv.cq != nullptr) pollers_[recv.cq->shard]->FenceRetired(ending, qp_num, &recv, 1);
}

bool RuntimeImpl::Unregister(uint32_t index, uint32_t generation) noexcept {
  if (CallerRoles() & kRefusedControlCallers) return false;  // as CQD_REFUSE_ON_RUNTIME_THREAD
  std::unique_lock<ControlMutex> lock(mu_);
  const BatchTicket batch = Retire(index, generation, nullptr);
  if (!batch.retired) return true;  // already gone
  ChaosPoint();
  if (batch.seq != 0) {
    lock.unlock();  // a handler in that batch may want mu_
    while (!consumers_[batch.consumer]->BatchOver(batch.seq)) WaitStep();  // thread_role.h
    lock.lock();
  }
  slots_.Free(index);
  lock.unlock();
  // After Shutdown: CM events it handed on (cm_router.h), now, or after the batch of the handler
  // calling this.
  events_->cm().held().DeliverAllOrAfterBatch();
  return true;
}

BatchTicket RuntimeImpl::RetireTeardown(TeardownState& state) noexcept {
  std::lock_guard<ControlMutex> lock(mu_);
  return Retire(state.slot, state.generation, &state);
}

bool RuntimeImpl::BatchOver(const BatchTicket& ticket) const noexcept {
  return consumers_[ticket.consumer]->BatchOver(ticket.seq);
}

void RuntimeImpl::FreeSlot(uint32_t index) noexcept {
  std::lock_guard<ControlMutex> lock(mu_);
  slots_.Free(index);
}

bool RuntimeImpl::RedriveDrain(const TeardownState& state) noexcept {
  std::lock_guard<ControlMutex> lock(mu_);
  const Slot& slot = slots_.slot(state.slot);
  if (!StateLiveAs(slot.state.load(std::memory_order_relaxed), state.generation)) return false;
  DeviceRecord* device = devices_[state.device - 1].get();
  return device->backend
      ->RedriveDrain(slot.qp.load(std::memory_order_relaxed),
                     state.recv_marker_owed ? state.recv_marker() : 0)
      .ok();
}

void RuntimeImpl::PostFence(const TeardownState& state) noexcept {
  const Slot& slot = slots_.slot(state.slot);
  if (StateGeneration(slot.state.load(std::memory_order_acquire)) != state.generation) return;
  AsyncEvent fence;
  fence.type = IBV_EVENT_QP_LAST_WQE_REACHED;
  fence.qp_num = slot.qp_num.load(std::memory_order_relaxed);
  fence.device = slot.device.load(std::memory_order_relaxed);
  std::vector<Poller*> pollers;
  for (auto& p : pollers_) pollers.push_back(p.get());
  PostQpEvent(slots_, pollers, state.slot, fence, fence.device, /*fence=*/true);
}

Result<std::shared_ptr<TeardownState>> RuntimeImpl::TeardownQp(uint32_t index, uint32_t generation,
                                                               const TeardownOptions& options) {
  CQD_REFUSE_ON_RUNTIME_THREAD("TeardownQp");
  if (options.timeout.count() <= 0) return InvalidArgument("TeardownQp: timeout must be > 0");
  if (options.last_wqe_grace.count() < 0) {
    return InvalidArgument("TeardownQp: last_wqe_grace must not be negative");
  }
  std::unique_lock<ControlMutex> lock(mu_);
  if (shut_down_) return FailedPrecondition("TeardownQp: the runtime is shut down");
  Slot& slot = slots_.slot(index);
  const uint64_t state = slot.state.load(std::memory_order_relaxed);
  if (!StateLiveAs(state, generation)) {
    return InvalidArgument("TeardownQp: the registration is no longer live");
  }
  if (StateDraining(state)) return FailedPrecondition("TeardownQp: already tearing down");
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
  if (device->failed.load(std::memory_order_acquire)) {
    // Nothing flushes on a dead device: unregister at once (on the teardown thread).
    teardown->end_with = Unavailable("TeardownQp: device " + device->backend->name() +
                                     " has failed; unregistered without draining");
    teardowns_->Add(teardown);
    return teardown;
  }
  // Draining before the markers exist, so that the pollers recognize them.
  const uint32_t consumer = StateConsumer(state);
  if (consumers_[consumer]->kind() == ConsumerKind::kEngineDriven) {
    teardown->drainer = &consumers_[consumer]->last_drainer();
  }
  for (int k = 0; k < 2; ++k) {  // the markers come back only through the CQs' shards
    const CqRecord* cq =
        cqs_.Find((k == 0 ? slot.send_cq : slot.recv_cq).load(std::memory_order_relaxed));
    if (cq != nullptr && pollers_[cq->shard]->engine_driven()) {
      teardown->shard_drivers[k] = &pollers_[cq->shard]->last_driver();
    }
  }
  slot.teardown.store(teardown.get(), std::memory_order_relaxed);
  const uint32_t epoch = slot.drain_epoch.load(std::memory_order_relaxed) + 1;
  slot.drain_epoch.store(epoch == 0 ? 1 : epoch, std::memory_order_relaxed);
  slot.state.store(MakeState(generation, consumer, true, /*draining=*/true),
                   std::memory_order_seq_cst);
  Result<backend::DrainStart> posted = device->backend->StartQpDrain(
      slot.qp.load(std::memory_order_relaxed), teardown->send_marker(), teardown->recv_marker());
  if (!posted.ok()) {
    // No marker went out. Back to live; a batch that saw `draining` may still read the state
    // through slot.teardown: wait for it (without mu_, as Unregister does) before it goes.
    slot.state.store(state, std::memory_order_seq_cst);
    lock.unlock();
    consumers_[consumer]->WaitForBatchInProgress(index);
    lock.lock();
    if (slot.teardown.load(std::memory_order_relaxed) == teardown.get()) {
      slot.teardown.store(nullptr, std::memory_order_release);
    }
    return Status(posted.status().code(), "TeardownQp: " + posted.status().message());
  }
  Result<backend::QpCaps> caps = device->backend->QueryQp(slot.qp.load(std::memory_order_relaxed));
  // An SRQ QP has no receive marker: its receive side is known to be flushed by LAST_WQE_REACHED
  // or the fence that stands in for it. A receive marker that found the queue full is posted again
  // by the teardown thread once the flushes have made room (TeardownHost::RedriveDrain).
  teardown->srq = caps.ok() && caps->srq;
  if (*posted == backend::DrainStart::kNothingOutstanding) {
    teardown->end_with = Status::Ok();
  } else {
    teardown->markers = TeardownState::kSendMarker;
    if (!teardown->srq && *posted == backend::DrainStart::kAllMarkers) {
      teardown->markers |= TeardownState::kRecvMarker;
    }
    teardown->recv_marker_owed = !teardown->srq && *posted == backend::DrainStart::kSendMarkerOnly;
  }
  teardowns_->Add(teardown);
  return teardown;
}

int RuntimeImpl::Drain(ConsumerId consumer, int max) noexcept {
  if (consumer >= consumers_.size()) return -EINVAL;
  Consumer& c = *consumers_[consumer];
  if (c.kind() != ConsumerKind::kEngineDriven) return -EINVAL;
  if (c.DispatchingHere()) return -EBUSY;  // from one of its own handlers
  return max <= 0 ? 0 : c.Drain(max);
}

// A handler of any kind, or an OrphanHandler or DeviceEventHandler: driving a shard from there
// would nest one poller's pass inside another's (or inside a consumer's batch), and a wait duty
// serves one shard only.
static bool InsideRuntimeCallback() noexcept {
  return (CallerRoles() & (kRoleRuntimeThread | kRoleWaitDuty | kRoleHandler)) != 0;
}

int RuntimeImpl::PollShard(int shard, int budget) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size() || budget < 1) return -EINVAL;
  Poller& poller = *pollers_[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.Step(budget);
}

int RuntimeImpl::TrySleepShard(int shard) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size()) return -EINVAL;
  Poller& poller = *pollers_[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.PrepareSleep();
}

Result<int> RuntimeImpl::ShardFd(int shard) {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size()) {
    return InvalidArgument("ShardFd: shard " + Str(shard) + " is not in 0.." +
                           Str(pollers_.size() - 1));
  }
  if (!pollers_[shard]->engine_driven()) {
    return InvalidArgument("ShardFd: shard " + Str(shard) +
                           " has a poller thread of the runtime; only engine-driven shards "
                           "(RuntimeOptions::engine_shards) have a shard fd");
  }
  return pollers_[shard]->fd();
}

Result<int> RuntimeImpl::NotifyFd(ConsumerId consumer) {
  if (consumer >= consumers_.size()) {
    return InvalidArgument("NotifyFd: consumer " + Str(consumer) + " is not in 0.." +
                           Str(consumers_.size() - 1));
  }
  if (consumers_[consumer]->kind() != ConsumerKind::kEngineDriven) {
    return InvalidArgument("NotifyFd: consumer " + Str(consumer) +
                           " is runtime-owned; only engine-driven consumers have a notify fd");
  }
  return consumers_[consumer]->notify_fd();
}

Stats RuntimeImpl::GetStats() const {
  Stats stats;
  stats.uptime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - created_)
                        .count();
  for (const auto& poller : pollers_) stats.pollers.push_back(poller->stats());
  for (const auto& consumer : consumers_) {
    ConsumerStats c;
    c.name = consumer->name();
    c.delivered = consumer->delivered();
    c.async_events = consumer->async_delivered();
    c.queue_depth = consumer->depth();
    c.high_water = consumer->high_water();
    c.queue_capacity = options_.consumers[consumer->index()].queue_capacity;
    c.spill_capacity = options_.consumers[consumer->index()].spill_capacity;
    for (const auto& poller : pollers_) poller->AddSpillStats(consumer->index(), c);
    if (consumer->latency() != nullptr) c.latency = consumer->latency()->Snapshot();
    stats.consumers.push_back(std::move(c));
  }
  placement_.FillStats(stats);
  stats.registrations = live_registrations_.load(std::memory_order_relaxed);
  stats.max_registrations = options_.max_registrations;
  if (CallerRoles() & kRefusedControlCallers) return stats;  // the CQ part needs the mutex
  std::lock_guard<ControlMutex> lock(mu_);
  cqs_.FillStats(stats);
  stats.orphans = orphans_.total();
  stats.async_events = events_->async_events();
  stats.failed_fds = events_->failed_fds();
  stats.cm_events = events_->cm_events();
  return stats;
}

Status RuntimeImpl::Shutdown() {
  // It joins every thread: a handler or on_done would wait for itself.
  if (Status refused =
          CheckCaller("Shutdown", kRefusedControlCallers | kRoleHandler | kRoleTeardownThread);
      !refused.ok()) {
    return refused;
  }
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mu_);
  {
    std::lock_guard<ControlMutex> lock(mu_);
    if (shut_down_) return Status::Ok();
    shut_down_ = true;  // from here TeardownQp is refused
  }
  // Not under mu_: the server's thread may be waiting for it in GetStats.
  if (stats_server_ != nullptr) stats_server_->Stop();
  // Pending teardowns end first (drained ones OK, the rest kCancelled), while the pollers and
  // consumers they need to retire run, and before any join that could wait for a thread
  // waiting for one. Then the event thread: what it read it already posted to the pollers. Then
  // the pollers: they hand everything they hold to the consumers. Then the owned consumers,
  // which dispatch everything queued before they exit.
  teardowns_->Stop();
  events_->Stop();
  for (auto& poller : pollers_) poller->Stop();
  for (auto& consumer : consumers_) consumer->Stop();
  return Status::Ok();
}

}  // namespace cqd::internal
