// SPDX-License-Identifier: BSD-2-Clause
// The facade: cqd/runtime.h on top of the core (runtime/core/runtime_impl.h). It checks and
// converts what engines pass, makes the backend a device needs (the only place that names one),
// and keeps exceptions from crossing the library boundary (Guarded).
#include "cqd/runtime.h"

#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "cqd/sim.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/backend/verbs/verbs_device.h"
#include "runtime/base/mutex.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"
#include "runtime/core/options_check.h"
#include "runtime/core/runtime_impl.h"

namespace cqd {

namespace {

// The control path never throws across the library boundary: memory or thread exhaustion in a
// control call comes back as a status.
template <typename Fn>
auto Guarded(const char* op, Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(std::string(op) + ": out of memory");
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string(op) + ": " + e.what());
  } catch (const std::exception& e) {
    return Internal(std::string(op) + ": " + e.what());
  }
}

}  // namespace

Result<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options) {
  return Guarded("Runtime::Create", [&]() -> Result<std::unique_ptr<Runtime>> {
    if (Status s = internal::CheckOptions(options); !s.ok()) {
      return Status(s.code(), "Runtime::Create: " + s.message());
    }
    auto impl = std::make_unique<internal::RuntimeImpl>(options);
    if (Status s = impl->Start(); !s.ok()) return s;
    return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
  });
}

Runtime::Runtime(std::unique_ptr<internal::RuntimeImpl> impl) : impl_(std::move(impl)) {}

Result<CqHandle> Runtime::ToHandle(Result<internal::PolledCq> polled) {
  if (!polled.ok()) return polled.status();
  CqHandle handle;
  handle.runtime_ = polled->runtime;
  handle.id_ = polled->id;
  handle.shard_ = polled->shard;
  handle.device_ = polled->device;
  if (polled->kind == backend::Kind::kSim) {
    handle.sim_ = static_cast<SimCq*>(polled->native);
  } else {
    handle.verbs_ = static_cast<ibv_cq*>(polled->native);
  }
  return handle;
}

Result<Registration> Runtime::ToRegistration(Result<internal::RegisteredQp> registered) {
  if (!registered.ok()) return registered.status();
  Registration registration;
  registration.impl_ = impl_.get();
  registration.slot_ = registered->slot;
  registration.generation_ = registered->generation;
  registration.qp_num_ = registered->qp_num;
  return registration;
}

Runtime::~Runtime() = default;

Result<DeviceId> Runtime::AddVerbsDevice(ibv_context* context, DeviceEventHandler* events) {
  if (context == nullptr) return InvalidArgument("AddVerbsDevice: context is null");
  return Guarded("AddVerbsDevice", [&] {
    return impl_->AddDevice(
        "AddVerbsDevice",
        std::make_unique<verbs_internal::VerbsBackend>(context, /*close_on_destroy=*/false),
        events);
  });
}
Result<DeviceId> Runtime::OpenVerbsDevice(const std::string& name, DeviceEventHandler* events) {
  return Guarded("OpenVerbsDevice", [&]() -> Result<DeviceId> {
    Result<ibv_context*> context = verbs_internal::OpenDevice(name);
    if (!context.ok()) {
      return Status(context.status().code(), "OpenVerbsDevice: " + context.status().message());
    }
    // Owned from here: the backend closes the context, on failure too.
    auto device =
        std::make_unique<verbs_internal::VerbsBackend>(*context, /*close_on_destroy=*/true);
    return impl_->AddDevice("OpenVerbsDevice", std::move(device), events);
  });
}
Result<ibv_context*> Runtime::VerbsContext(DeviceId device) {
  return Guarded("VerbsContext", [&]() -> Result<ibv_context*> {
    Result<void*> context = impl_->DeviceNative("VerbsContext", device, backend::Kind::kVerbs);
    if (!context.ok()) return context.status();
    return static_cast<ibv_context*>(*context);
  });
}
Result<DeviceId> Runtime::FindVerbsDevice(ibv_context* context) {
  if (Status s = internal::CheckCaller("FindVerbsDevice"); !s.ok()) return s;
  if (context == nullptr) return InvalidArgument("FindVerbsDevice: context is null");
  return Guarded("FindVerbsDevice", [&] {
    return impl_->FindDevice("FindVerbsDevice", backend::Kind::kVerbs, context);
  });
}
Result<DeviceId> Runtime::AddSimDevice(std::shared_ptr<SimDevice> device,
                                       DeviceEventHandler* events) {
  if (Status s = internal::CheckCaller("AddSimDevice"); !s.ok()) return s;
  return Guarded("AddSimDevice", [&]() -> Result<DeviceId> {
    auto backend = sim_internal::SimBackend::Over(std::move(device));
    if (!backend.ok()) {
      return Status(backend.status().code(), "AddSimDevice: " + backend.status().message());
    }
    return impl_->AddDevice("AddSimDevice", std::move(backend).value(), events);
  });
}
Result<CqHandle> Runtime::CreateCq(DeviceId device, int shard, const CqOptions& options) {
  return Guarded("CreateCq", [&] { return ToHandle(impl_->CreateCq(device, shard, options)); });
}
Result<ibv_comp_channel*> Runtime::VerbsChannelFor(DeviceId device, int shard) {
  return Guarded("VerbsChannelFor", [&]() -> Result<ibv_comp_channel*> {
    Result<void*> channel =
        impl_->NativeChannel("VerbsChannelFor", device, shard, backend::Kind::kVerbs);
    if (!channel.ok()) return channel.status();
    return static_cast<ibv_comp_channel*>(*channel);
  });
}
Result<SimChannel*> Runtime::SimChannelFor(DeviceId device, int shard) {
  return Guarded("SimChannelFor", [&]() -> Result<SimChannel*> {
    Result<void*> channel =
        impl_->NativeChannel("SimChannelFor", device, shard, backend::Kind::kSim);
    if (!channel.ok()) return channel.status();
    return static_cast<SimChannel*>(*channel);
  });
}
Result<CqHandle> Runtime::AdoptCq(DeviceId device, int shard, ibv_cq* cq,
                                  const CqOptions& options) {
  return Guarded("AdoptCq", [&] {
    return ToHandle(impl_->AdoptCq(device, shard, backend::Kind::kVerbs, cq, options));
  });
}
Result<CqHandle> Runtime::AdoptCq(DeviceId device, int shard, SimCq* cq, const CqOptions& options) {
  return Guarded("AdoptCq", [&] {
    return ToHandle(impl_->AdoptCq(device, shard, backend::Kind::kSim, cq, options));
  });
}
Status Runtime::DestroyCq(CqHandle cq) {
  return Guarded("DestroyCq", [&] { return impl_->DestroyCq(cq.runtime_, cq.id_); });
}
Result<Registration> Runtime::RegisterQp(ibv_qp* qp, QpHandler& handler, ConsumerId consumer,
                                         const QpOptions& options) {
  if (qp == nullptr) return InvalidArgument("RegisterQp: qp is null");
  return Guarded("RegisterQp", [&] {
    return ToRegistration(
        impl_->RegisterQp(qp->qp_num, qp, qp->send_cq, qp->recv_cq, handler, consumer, options));
  });
}
Result<Registration> Runtime::RegisterQp(rdma_cm_id* id, QpHandler& handler, ConsumerId consumer,
                                         const QpOptions& options) {
  if (id == nullptr) return InvalidArgument("RegisterQp: id is null");
  if (id->qp == nullptr) {
    return InvalidArgument("RegisterQp: the rdma_cm_id has no QP (rdma_create_qp first)");
  }
  return Guarded("RegisterQp", [&]() -> Result<Registration> {
    ibv_qp* qp = id->qp;
    Result<Registration> registration = ToRegistration(
        impl_->RegisterQp(qp->qp_num, qp, qp->send_cq, qp->recv_cq, handler, consumer, options));
    if (!registration.ok()) return registration;
    if (!impl_->BindCm(id,
                       {registration->slot_, registration->generation_, registration->qp_num_})) {
      registration->Unregister();
      return ResourceExhausted("RegisterQp: out of memory binding the rdma_cm_id");
    }
    return registration;
  });
}
Result<Registration> Runtime::RegisterQp(const SimQp& qp, QpHandler& handler, ConsumerId consumer,
                                         const QpOptions& options) {
  return Guarded("RegisterQp", [&] {
    return ToRegistration(
        impl_->RegisterQp(qp.qp_num(), const_cast<SimQp*>(&qp), static_cast<void*>(qp.send_cq()),
                          static_cast<void*>(qp.recv_cq()), handler, consumer, options));
  });
}
Status Runtime::WatchCmChannel(rdma_event_channel* channel, CmHandler& handler,
                               ConsumerId consumer) {
  return Guarded("WatchCmChannel",
                 [&] { return impl_->WatchCmChannel(channel, handler, consumer); });
}
Status Runtime::UnwatchCmChannel(rdma_event_channel* channel) {
  return Guarded("UnwatchCmChannel", [&] { return impl_->UnwatchCmChannel(channel); });
}
Result<Teardown> Runtime::TeardownQp(Registration& registration, const TeardownOptions& options) {
  if (!registration.registered()) return InvalidArgument("TeardownQp: not registered");
  if (registration.impl_ != impl_.get()) {
    return InvalidArgument("TeardownQp: the registration belongs to another runtime");
  }
  return Guarded("TeardownQp", [&]() -> Result<Teardown> {
    auto state = impl_->TeardownQp(registration.slot_, registration.generation_, options);
    if (!state.ok()) return state.status();
    registration.impl_ = nullptr;  // the teardown unregisters it
    Teardown teardown;
    teardown.state_ = std::move(state).value();
    return teardown;
  });
}

bool Teardown::done() const {
  if (state_ == nullptr) return false;
  internal::MutexLock lock(state_->mu);
  return state_->done;
}

Status Teardown::Wait() const {
  if (state_ == nullptr) return FailedPrecondition("Teardown::Wait: no teardown");
  internal::MutexLock lock(state_->mu);
  if (state_->done) return state_->result;
  // The threads a teardown may need, or that others need while it runs (runtime.h, "Waiting").
  const char* refused = internal::RefusalReason(
      internal::CallerRoles(state_->engine_threads),
      internal::kRoleHandler | internal::kRoleRuntimeThread | internal::kRoleTeardownThread |
          internal::kRoleLogSink | internal::kRoleWaitDuty | internal::kRoleCallback |
          internal::kRoleEngineThread);
  if (refused != nullptr) {
    return FailedPrecondition(std::string("Teardown::Wait: ") + refused +
                              "; use done() or TeardownOptions::on_done instead");
  }
  while (!state_->done) state_->cv.WaitForRecheck(state_->mu);
  return state_->result;
}

bool Runtime::InCallback() noexcept { return internal::CallerRoles() != 0; }

int Runtime::Drain(ConsumerId consumer, int max) noexcept { return impl_->Drain(consumer, max); }
int Runtime::PollShard(int shard, int budget) noexcept { return impl_->PollShard(shard, budget); }
int Runtime::TrySleepShard(int shard) noexcept { return impl_->TrySleepShard(shard); }
Result<int> Runtime::ShardFd(int shard) {
  return Guarded("ShardFd", [&] { return impl_->ShardFd(shard); });
}
Result<int> Runtime::NotifyFd(ConsumerId consumer) {
  return Guarded("NotifyFd", [&] { return impl_->NotifyFd(consumer); });
}
Stats Runtime::GetStats() const { return impl_->GetStats(); }
Status Runtime::Shutdown() {
  return Guarded("Shutdown", [&] { return impl_->Shutdown(); });
}

Registration::Registration(Registration&& other) noexcept
    : impl_(std::exchange(other.impl_, nullptr)),
      slot_(other.slot_),
      generation_(other.generation_),
      qp_num_(other.qp_num_) {}

Registration& Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Unregister();
    impl_ = std::exchange(other.impl_, nullptr);
    slot_ = other.slot_;
    generation_ = other.generation_;
    qp_num_ = other.qp_num_;
  }
  return *this;
}

void Registration::Unregister() noexcept {
  if (impl_ != nullptr && impl_->Unregister(slot_, generation_)) impl_ = nullptr;
}

}  // namespace cqd
