// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/runtime_impl.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cqd::internal {

RuntimeImpl::RuntimeImpl(const RuntimeOptions& options)
    : core_(options),
      engine_(core_),
      teardowns_(core_, registrations_, devices_, engine_),
      devices_(core_, placement_),
      cqs_(core_, devices_, placement_),
      registrations_(core_, devices_, cqs_),
      placement_(core_.options),
      stats_(core_, devices_, cqs_, registrations_, placement_) {}

Status RuntimeImpl::Start() {
  for (auto& consumer : core_.consumers) {
    if (Status s = consumer->Start(); !s.ok()) return s;
  }
  if (Status s = core_.events->Start(); !s.ok()) return s;
  for (auto& poller : core_.pollers) {
    if (Status s = poller->Start(); !s.ok()) return s;
  }
  teardowns_.Start();
  if (Status s = stats_.Start(); !s.ok()) return s;
  started_ = true;
  return Status::Ok();
}

RuntimeImpl::~RuntimeImpl() {
  // A runtime whose Start failed ran no callback and waits for nobody's: Runtime::Create may
  // fail inside a callback of another runtime and still return its status.
  if (const Status shut = started_ ? Shutdown() : StopEverything(); !shut.ok()) {
    // Refused: a cqd callback (of any runtime) destroys this one. Going on would join or free
    // threads still running, perhaps the very one here: stop the process, as runtime.h says.
    core_.log.Error("~Runtime: " + shut.message() + "; the process terminates");
    std::fprintf(stderr, "cqd: ~Runtime: %s; the process terminates\n", shut.message().c_str());
    std::abort();
  }
  for (auto& consumer : core_.consumers) consumer->OrphanRemaining();  // engine-driven leftovers
  // The threads are gone: poll every CQ empty (to the orphan sink), flush its unacked events
  // (S2) so destroy cannot hang, and destroy or release it.
  CqTable& cqs = *cqs_.table();
  for (auto& [id, cq] : cqs.live()) {
    core_.pollers[cq->shard]->RemoveCq(cq.get());
    cq->Ack(cq->acks.TakeAll());
    if (cq->adopted) {
      cq->device->backend->ReleaseCq(cq->cq);
    } else {
      (void)cq->device->backend->DestroyCq(cq->cq);  // fails only while the engine holds QPs
    }
  }
  for (auto& cq : cqs.released()) cq->Ack(cq->acks.TakeAll());
  for (auto& device : devices_.all()) {
    for (backend::Channel* channel : device->channels) {
      (void)device->backend->DestroyChannel(channel);
    }
  }
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
    ControlLock lock(core_.mu);
    if (core_.shut_down) return Status::Ok();
    core_.shut_down = true;  // from here TeardownQp is refused
  }
  // Not under mu: the server's thread may be waiting for it in GetStats.
  stats_.Stop();
  // Pending teardowns end first (drained ones OK, the rest kCancelled), while the pollers and
  // consumers they need to retire run, and before any join that could wait for a thread
  // waiting for one. Then the event thread: what it read it already posted to the pollers. Then
  // the pollers: they hand everything they hold to the consumers. Then the owned consumers,
  // which dispatch everything queued before they exit.
  teardowns_.Stop();
  core_.events->Stop();
  for (auto& poller : core_.pollers) poller->Stop();
  for (auto& consumer : core_.consumers) consumer->Stop();
  return Status::Ok();
}

}  // namespace cqd::internal
