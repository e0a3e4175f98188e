// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/poller.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "runtime/base/chaos.h"
#include "runtime/base/pinning.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {

using Clock = std::chrono::steady_clock;

Poller::Poller(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
               const SlotPool& slots, OrphanSink& orphans)
    : index_(index),
      options_(options),
      consumers_(consumers),
      slots_(slots),
      orphans_(orphans),
      may_park_(!options.busy_poll && options.cq_park_after.count() > 0),
      wcs_(std::make_unique<ibv_wc[]>(options.poll_batch)),
      batch_slots_(std::make_unique<const Slot*[]>(options.poll_batch)),
      stamp_(std::any_of(options.consumers.begin(), options.consumers.end(),
                         [](const ConsumerOptions& c) { return c.record_latency; })),
      engine_driven_(std::find(options.engine_shards.begin(), options.engine_shards.end(), index) !=
                     options.engine_shards.end()) {
  if (engine_driven_) {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    parker_.UseEventFd(wake_fd_);
  }
  for (size_t c = 0; c < consumers_.size(); ++c) {
    tokens_.push_back(consumers_[c]->MakeProducerToken());
    lanes_.push_back(&consumers_[c]->lane(index_));
    consumers_[c]->SetProducerParker(index_, &parker_);
    const ConsumerOptions& co = options.consumers[c];
    if (co.kind == ConsumerKind::kRunToCompletion && co.poller == index_) {
      consumers_[c]->RunOnPoller(&parker_);
      hosted_.push_back(consumers_[c]);
      lanes_.back()->direct = true;
    }
  }
  if (!hosted_.empty()) {  // only a run-to-completion consumer of this poller's polls may fuse
    fused_wcs_ = std::make_unique<ibv_wc[]>(options.poll_batch);
    run_starts_ = std::make_unique<int[]>(options.poll_batch + 1);
  }
  listed_.reserve(consumers_.size());
  fences_.Reserve(kFencesReserved);
}

Poller::~Poller() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status Poller::Start() {
  if (engine_driven_ && wake_fd_ < 0) {
    return ErrnoStatus("engine-driven shard " + std::to_string(index_) + ": eventfd", errno);
  }
  started_.store(true, std::memory_order_relaxed);
  mailbox_.Open();
  if (!engine_driven_) thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void Poller::Stop() {
  if (engine_driven_) {
    if (stopped_.load(std::memory_order_acquire) || wake_fd_ < 0) return;
    RunSync([this] {
      HandOverAll();
      stopped_.store(true, std::memory_order_release);
    });
    parker_.Wake();  // the engine's next Step dispatches what its hosted consumers hold
    return;
  }
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  parker_.Wake();
  thread_.join();
}

void Poller::RunSync(const std::function<void()>& fn) {
#if CQD_DCHECKS_ON
  const std::function<void()> checked = [this, &fn] {
    CQD_DCHECK(OnDriver(), "a poller's control part ran off its driver thread");
    fn();
  };
  RunOnDriver(checked);
#else
  RunOnDriver(fn);
#endif
}

void Poller::RunOnDriver(const std::function<void()>& fn) {
  if (ServingAs(this)) {  // a run-to-completion handler of this poller
    SettleFused();        // inside a fused poll: what it still holds is routed first
    fn();
    return;
  }
  if (engine_driven_) {
    // Run by this thread if nobody drives the shard, else by the driver before it lets go.
    mailbox_.RunSync(fn, [this] { ServeIfFree(); });
    return;
  }
  mailbox_.RunSync(fn, [this] { parker_.Wake(); });
}

void Poller::ServeMailbox(void* self) {
  Poller* poller = static_cast<Poller*>(self);
  if (!poller->mailbox_.pending()) return;
  poller->SettleFused();
  poller->mailbox_.RunPosted();
}

int Poller::RunHosted() noexcept {
  // Handlers may call the runtime from here (thread_role.h).
  const HostedDispatchScope dispatching(&Poller::ServeMailbox, this);
  int worked = 0;
  for (Consumer* consumer : hosted_) {
    // A few batches per pass, so that polling goes on under a steady stream.
    for (int round = 0; round < 4; ++round) {
      const int n = DispatchHosted(*consumer);
      if (n == 0) break;
      worked += n;
    }
  }
  return worked;
}

int Poller::DispatchHosted(Consumer& consumer) noexcept {
  // What this poller queued is older than its spill: the queue goes first.
  if (consumer.Pending()) return consumer.Dispatch(1024);
  Lane& lane = *lanes_[consumer.index()];
  if (lane.spill_empty()) return 0;
  const uint64_t begin = lane.published();
  const uint32_t at = lane.IndexOf(begin);
  const uint32_t n = std::min({lane.spill_size(), static_cast<uint32_t>(consumer.dispatch_batch()),
                               static_cast<uint32_t>(lane.size() - at)});
  // Out of the spill before any handler runs: one may purge it (Unregister runs inline here).
  // The ring keeps the entries until DispatchLane releases them.
  lane.Publish(n);
  NoteSpill(consumer.index());
  consumer.DispatchLane(lane, at, n, begin + n);
  // Everything this lane held is dispatched and released, on this thread: start the ring over
  // (TryRewind checks that), so the next poll writes lines this one has just used, still in this
  // core's cache, as an inline loop's poll array is. The check reads only this thread's stores.
  if (lane.spill_empty() && lane.tail_at() != 0) lane.TryRewind();
  return static_cast<int>(n);
}

bool Poller::HostedPending() const noexcept {
  for (const Consumer* consumer : hosted_) {
    if (consumer->Pending() || !lanes_[consumer->index()]->spill_empty()) return true;
  }
  return false;
}

void Poller::Run() {
  MarkRuntimeThread();
  thread_token_.store(ThreadToken(), std::memory_order_relaxed);
  PinAndNameThread(options_.poller_cpus.empty() ? -1 : options_.poller_cpus[index_],
                   "cqd-poll" + std::to_string(index_));
  Clock::time_point idle_since;
  bool idle = false;
  for (;;) {
    if (mailbox_.pending()) mailbox_.RunPosted();
    if (stop_.load(std::memory_order_acquire)) break;
    if (Pass(INT32_MAX) > 0) {
      idle = false;
      continue;
    }
    if (options_.busy_poll) {
      if (!listed_.empty()) CpuRelax();  // waiting for a full consumer
      continue;
    }
    Clock::time_point now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    } else if (now - idle_since >= options_.idle_budget) {
      TrySleep();
      idle = false;
    }
  }
  HandOverAll();
  // The run-to-completion consumers' last handlers run here (events posted meanwhile go straight
  // to their queues, and whatever a handler's control call routes here meanwhile is dispatched
  // from the spill); then they close.
  for (Consumer* consumer : hosted_) {
    const Lane& lane = *lanes_[consumer->index()];
    while (!lane.spill_empty() || !consumer->CloseIfEmpty()) (void)RunHosted();
  }
  mailbox_.Close();
  thread_token_.store(0, std::memory_order_relaxed);
}

void Poller::HandOverAll() {
  // Everything taken off the CQs so far, and every posted event, reaches a consumer (they
  // outlive the pollers' shutdown). PostEvent waits on inbox_mu_ meanwhile and afterwards hands
  // events over directly, behind everything this flush moved.
  MutexLock lock(inbox_mu_);
  for (PostedEvent& posted : inbox_) deferred_.push_back(posted);
  inbox_.clear();
  Flush(/*force=*/true);
  // Behind everything the lanes handed over, each event on its own (it needs no lane room).
  for (PostedEvent& posted : deferred_) PushAlone(posted.consumer, posted.item);
  deferred_.clear();
  inbox_open_ = false;
}

// The stages of a pass, in order. Events go first, so that each is placed behind its catch-up
// before more is polled; spills next, so that room freed since the last pass is used before the
// CQs are polled for more; parked CQs whose event came rejoin the passes before them; the hosted
// consumers last, dispatching what this pass polled.
const Poller::Stage Poller::kStages[kStageCount] = {
    {"events", &Poller::PollEvents, &Poller::EventsMayIdle},
    {"spills", &Poller::PollSpills, &Poller::SpillsMayIdle},
    {"parked", &Poller::PollParked, &Poller::ParkedMayIdle},
    {"cqs", &Poller::PollCqs, &Poller::CqsMayIdle},
    {"hosted", &Poller::PollHosted, &Poller::HostedMayIdle},
};

int Poller::Pass(int budget) noexcept {
  CQD_DCHECK(OnDriver(), "a poller's pass ran off its driver thread");
  int work = 0;
  for (const Stage& stage : kStages) work += (this->*stage.poll)(budget);
  return work;
}

bool Poller::ArmAndRecheck() noexcept {
  CQD_DCHECK(OnDriver(), "a poller's sleep protocol ran off its driver thread");
  for (const Stage& stage : kStages) {
    if (!(this->*stage.may_idle)()) return true;
  }
  return mailbox_.pending();
}

int Poller::PollEvents(int) noexcept {
  if (!inbox_pending_.load(std::memory_order_acquire) && deferred_.empty()) return 0;
  return PlaceEvents() ? 1 : 0;  // events, each behind its catch-up
}

bool Poller::EventsMayIdle() noexcept {
  // Posted since the last pass (the event thread sets the flag before it wakes the parker): the
  // next pass places it.
  if (inbox_pending_.load(std::memory_order_seq_cst)) return false;
  if (deferred_.empty()) return true;
  // An event held back for want of lane room: its consumer wakes the sleeper when it frees room.
  for (const PostedEvent& posted : deferred_) {
    lanes_[posted.consumer]->wants_room.store(true, std::memory_order_seq_cst);
  }
  ChaosPoint();  // asked, not yet looked again
  // Room freed before the stores above was not woken for: look for it now. An event waits for
  // lane room or for its CQs' catch-up; either way the spills stage, after this one, completes
  // the Dekker pair with the consumer (its seq_cst release of room, then its load of wants_room)
  // for every lane that holds entries, including the ones a catch-up here fills.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // A catch-up that took completions did work even when no event moved: its flush may have handed
  // a whole spill over (the lane leaves `listed_`, so the spills stage would not ask for its
  // room, and the event it freed room for would wait for a wake nobody owes).
  const uint64_t polled = completions_.load(std::memory_order_relaxed);
  const bool placed = PlaceEvents();
  return !placed && completions_.load(std::memory_order_relaxed) == polled;
}

int Poller::PollSpills(int) noexcept {
  // Spills the cqs stage holds are its to hand over, later in this pass.
  if (listed_.empty() || held_passes_ > 0) return 0;
  return Flush(false) ? 1 : 0;  // spills to their consumers
}

bool Poller::SpillsMayIdle() noexcept {
  if (listed_.empty()) return true;
  // A spill a full consumer holds back: as EventsMayIdle, the consumer's next batch that frees
  // room wakes the sleeper, so the sleep need not be bounded for it.
  for (uint32_t consumer : listed_) {
    lanes_[consumer]->wants_room.store(true, std::memory_order_seq_cst);
  }
  ChaosPoint();                                         // asked, not yet looked again
  std::atomic_thread_fence(std::memory_order_seq_cst);  // as in EventsMayIdle
  return !Flush(false);
}

int Poller::PollParked(int) noexcept {
  if (UnparkPending()) Unpark();  // parked CQs whose event came
  return 0;
}

bool Poller::ParkedMayIdle() noexcept {
  // The event thread bumps cq_events_ (seq_cst) before it wakes the parker.
  return !UnparkPending();
}

int Poller::PollCqs(int budget) noexcept {
  holding_ = !engine_driven_;  // PollShard hands over what it polled before it returns
  polls_full_ = true;
  const int found = PollAll(budget, /*may_fuse=*/true);
  holding_ = false;
  if (found > 0 && polls_full_ && held_passes_ < kMaxHeldPasses && MayHoldSpills()) {
    ++held_passes_;
    return found;
  }
  if (listed_.empty()) return found;
  return found + (Flush(false) ? 1 : 0);
}

bool Poller::MayHoldSpills() noexcept {
  bool held = false;
  const uint32_t poll = static_cast<uint32_t>(options_.poll_batch);
  for (uint32_t consumer : listed_) {
    Lane& lane = *lanes_[consumer];
    if (lane.direct) continue;  // dispatched from the spill, not handed over (PollHosted)
    if (lane.room() < poll ||
        lane.spill_size() + poll > kHeldBatches * consumers_[consumer]->dispatch_batch()) {
      return false;
    }
    held = true;
  }
  return held;
}

bool Poller::CqsMayIdle() noexcept {
  ArmAll();
  // S6: completions that arrived before arming raise no event: poll once more.
  return PollAll() == 0;
}

int Poller::PollHosted(int) noexcept { return hosted_.empty() ? 0 : RunHosted(); }

bool Poller::HostedMayIdle() noexcept {
  // Producers wake this poller, not the hosted consumers (Consumer::RunOnPoller).
  return !HostedPending();
}

bool Poller::SleepMustBeBounded() const noexcept {
  // No event may come: an arm failed, or the channel did.
  return arm_failed_ || notifications_broken_.load(std::memory_order_relaxed);
}

void Poller::TrySleep() noexcept {
  uint32_t ticket = parker_.Prepare();
  ChaosPoint();  // announced, not yet re-checked
  if (ArmAndRecheck() || stop_.load(std::memory_order_seq_cst)) {
    parker_.Cancel();
    return;
  }
  Count(sleeps_, 1);
  asleep_.store(true, std::memory_order_relaxed);
  if (SleepMustBeBounded()) {
    parker_.ParkFor(ticket, kRecheckUnarmed);
  } else {
    parker_.Park(ticket);
  }
  asleep_.store(false, std::memory_order_relaxed);
}

void Poller::ArmAll() noexcept {
  arm_failed_ = false;
  for (CqRecord* cq : cqs_) {
    if (cq->poll_failed || cq->device->failed.load(std::memory_order_relaxed)) continue;
    if (cq->armed.load(std::memory_order_seq_cst)) continue;  // a notification is pending (S7)
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    Count(arms_, 1);
    if (cq->cq->RequestNotify(cq->solicited_only) != 0) {
      // Not armed: no event will come. Clear the mark so the next sleep tries again, and sleep
      // only briefly meanwhile.
      cq->armed.store(false, std::memory_order_seq_cst);
      Count(arm_failures_, 1);
      arm_failed_ = true;
    }
  }
}

PollerStats Poller::stats() const {
  PollerStats s;
  s.cpu = options_.poller_cpus.empty() || engine_driven_ ? -1 : options_.poller_cpus[index_];
  s.engine_driven = engine_driven_ ? 1 : 0;
  s.polls = polls_.load(std::memory_order_relaxed);
  s.empty_polls = empty_polls_.load(std::memory_order_relaxed);
  s.completions = completions_.load(std::memory_order_relaxed);
  s.arms = arms_.load(std::memory_order_relaxed);
  s.arm_failures = arm_failures_.load(std::memory_order_relaxed);
  s.sleeps = sleeps_.load(std::memory_order_relaxed);
  s.backpressure_stalls = backpressure_stalls_.load(std::memory_order_relaxed);
  s.parks = parks_.load(std::memory_order_relaxed);
  s.parked_cqs = parked_count_.load(std::memory_order_relaxed);
  // Committed to a sleep, and no Wake has taken it since (a woken poller is about to run). The
  // announcement first (acquire): a later sleep's Prepare comes after the last one's asleep_ was
  // cleared, so asleep_ read true after it belongs to the sleep announced, past its re-check.
  const bool announced = parker_.sleeping();
  s.asleep = announced && asleep_.load(std::memory_order_relaxed) ? 1 : 0;
  return s;
}

void Poller::AddSpillStats(uint32_t consumer, ConsumerStats& out) const {
  const Lane& spill = *lanes_[consumer];
  out.spill_depth += spill.depth_stat.load(std::memory_order_relaxed);
  out.spill_high_water =
      std::max(out.spill_high_water, spill.high_water.load(std::memory_order_relaxed));
  out.stalls += spill.stalls.load(std::memory_order_relaxed);
  // Acquire: a stall this includes has ended for the load below too (Lane::stalled_ns).
  uint64_t stalled = spill.stalled_ns.load(std::memory_order_acquire);
  // The stall in progress counts too, so that an alert on stalled time sees a stuck consumer.
  if (const int64_t since = spill.stalled_since_ns.load(std::memory_order_relaxed); since != 0) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const uint64_t stall = now > since ? static_cast<uint64_t>(now - since) : 0;
    stalled += stall;
    out.stall_ns = std::max(out.stall_ns, stall);
  }
  // A counter: never below what an earlier snapshot reported (one that missed a stall ending
  // between the two loads above would be).
  uint64_t reported = spill.stalled_ns_reported.load(std::memory_order_relaxed);
  while (reported < stalled && !spill.stalled_ns_reported.compare_exchange_weak(
                                   reported, stalled, std::memory_order_relaxed)) {
  }
  out.stalled_ns += std::max(reported, stalled);
}

}  // namespace cqd::internal
