// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/runtime_impl.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/base/chaos.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/caller.h"

namespace cqd::internal {
namespace {

std::atomic<uint64_t> next_runtime_serial{1};

}  // namespace

Status RuntimeImpl::CheckCaller(const char* op, uint32_t refused) {
  const char* reason = RefusalReason(CallerRoles(), refused);
  if (reason == nullptr) return Status::Ok();
  return FailedPrecondition(std::string(op) + ": " + reason +
                            ", which must not make this call (runtime.h, \"Waiting\")");
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
    if (c.name.empty()) c.name = "consumer" + std::to_string(i);
    consumers_.push_back(std::make_unique<Consumer>(static_cast<uint32_t>(i), c, slots_, orphans_,
                                                    options_.pollers));
    consumers.push_back(consumers_.back().get());
  }
  std::vector<Shard*> pollers;
  for (int i = 0; i < options_.pollers; ++i) {
    pollers_.push_back(std::make_unique<Shard>(i, options_, consumers, slots_, orphans_));
    pollers.push_back(pollers_.back().get());
  }
  for (const auto& consumer : consumers_) {
    if (consumer->kind() == ConsumerKind::kEngineDriven) {
      engine_threads_.push_back(&consumer->last_drainer());
    }
  }
  for (const auto& poller : pollers_) {
    if (poller->engine_driven()) engine_threads_.push_back(&poller->last_driver());
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
  started_ = true;
  return Status::Ok();
}

RuntimeImpl::~RuntimeImpl() {
  // A runtime whose Start failed ran no callback and waits for nobody's: Runtime::Create may
  // fail inside a callback of another runtime and still return its status.
  if (const Status shut = started_ ? Shutdown() : StopEverything(); !shut.ok()) {
    // Refused: a cqd callback (of any runtime) destroys this one. Going on would join or free
    // threads still running, perhaps the very one here: stop the process, as runtime.h says.
    log_.Error("~Runtime: " + shut.message() + "; the process terminates");
    std::fprintf(stderr, "cqd: ~Runtime: %s; the process terminates\n", shut.message().c_str());
    std::abort();
  }
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

int RuntimeImpl::Drain(ConsumerId consumer, int max) noexcept {
  if (consumer >= consumers_.size()) return -EINVAL;
  Consumer& c = *consumers_[consumer];
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

int RuntimeImpl::PollShard(int shard, int budget) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size() || budget < 1) return -EINVAL;
  Shard& poller = *pollers_[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.Step(budget);
}

int RuntimeImpl::TrySleepShard(int shard) noexcept {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size()) return -EINVAL;
  Shard& poller = *pollers_[shard];
  if (!poller.engine_driven()) return -EINVAL;
  if (InsideRuntimeCallback()) return -EBUSY;
  return poller.PrepareSleep();
}

Result<int> RuntimeImpl::ShardFd(int shard) {
  if (shard < 0 || static_cast<size_t>(shard) >= pollers_.size()) {
    return InvalidArgument("ShardFd: shard " + std::to_string(shard) + " is not in 0.." +
                           std::to_string(pollers_.size() - 1));
  }
  if (!pollers_[shard]->engine_driven()) {
    return InvalidArgument("ShardFd: shard " + std::to_string(shard) +
                           " has a poller thread of the runtime; only engine-driven shards "
                           "(RuntimeOptions::engine_shards) have a shard fd");
  }
  return pollers_[shard]->fd();
}

Result<int> RuntimeImpl::NotifyFd(ConsumerId consumer) {
  if (consumer >= consumers_.size()) {
    return InvalidArgument("NotifyFd: consumer " + std::to_string(consumer) + " is not in 0.." +
                           std::to_string(consumers_.size() - 1));
  }
  if (consumers_[consumer]->kind() != ConsumerKind::kEngineDriven) {
    return InvalidArgument("NotifyFd: consumer " + std::to_string(consumer) +
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
  stats.orphans = orphans_.total();
  stats.async_events = events_->async_events();
  stats.failed_fds = events_->failed_fds();
  stats.cm_events = events_->cm_events();
  if (CallerRoles() & kRefusedControlCallers) return stats;  // the CQ part needs the mutex
  ControlLock lock(mu_);
  cqs_.FillStats(stats);
  return stats;
}

Status RuntimeImpl::Shutdown() {
  // It joins every thread, holding shutdown_mu_: from any cqd callback it could wait for itself
  // (a handler, on_done, or a CmHandler that a consumer or poller runs after its last batch while
  // a Shutdown joins it), so every role is refused (Runtime::InCallback()).
  if (Status refused = CheckCaller("Shutdown", kEveryRole); !refused.ok()) {
    return refused;
  }
  return StopEverything();
}

Status RuntimeImpl::StopEverything() {
  MutexLock shutdown_lock(shutdown_mu_);
  {
    ControlLock lock(mu_);
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
