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
#include "runtime/core/route.h"

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
  if (ServingAs(this)) {  // a run-to-completion handler of this poller, between two passes
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

void Poller::ServeIfFree() noexcept {
  if (!mailbox_.pending() || !TryDrive()) return;
  ServeAndRelease();
}

void Poller::Release() noexcept {
  driver_.store(0, std::memory_order_seq_cst);
  ChaosPoint();  // let go, mailbox not yet checked
  // A control call that found the driver taken relies on this check (the header comment).
  if (mailbox_.pending() && TryDrive()) ServeAndRelease();
}

void Poller::ServeAndRelease() noexcept {
  do {
    {
      const RuntimeThreadScope runtime(true);  // an OrphanHandler called here may not call in
      mailbox_.RunPosted();
    }
    parker_.Wake();  // the engine's next TrySleepShard arms what changed (a CQ added)
    driver_.store(0, std::memory_order_seq_cst);
  } while (mailbox_.pending() && TryDrive());
}

void Poller::EndSleep() noexcept {
  if (sleep_prepared_) {
    sleep_prepared_ = false;
    if (!parker_.TryCancel()) wake_owed_ = true;  // a Wake got there first: its write comes
  }
  if (!wake_owed_) return;
  uint64_t value = 0;
  ssize_t got;
  while ((got = read(wake_fd_, &value, sizeof(value))) < 0 && errno == EINTR) {
  }
  if (got == sizeof(value)) wake_owed_ = false;  // else not written yet: read it next time
}

bool Poller::KickOtherSleeper() noexcept {
  if (!sleep_prepared_ || sleeper_ == ThreadToken()) return false;
  // Another thread sleeps on the fd: wake it (one write, unless a Wake already made it) and
  // leave the announcement and the fd to it, so that nothing it relies on is taken from it.
  parker_.Wake();
  Release();
  return true;
}

int Poller::Step(int budget) noexcept {
  if (driver_.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int work = 0;
  {
    const RuntimeThreadScope runtime(true);  // as on a poller: OrphanHandlers may not call in
    if (last_driver_.load(std::memory_order_relaxed) != ThreadToken()) {
      last_driver_.store(ThreadToken(), std::memory_order_relaxed);
    }
    EndSleep();
    if (mailbox_.pending()) mailbox_.RunPosted();
    if (stopped_.load(std::memory_order_relaxed)) {
      work = StepStopped();
    } else {
      if (inbox_pending_.load(std::memory_order_acquire) || !deferred_.empty()) {
        work += PlaceEvents() ? 1 : 0;
      }
      if (!listed_.empty()) work += Flush(false) ? 1 : 0;
      if (UnparkPending()) Unpark();
      work += PollAll(budget);
      if (!hosted_.empty()) work += RunHosted();
    }
  }
  Release();
  return work;
}

int Poller::StepStopped() noexcept {
  // As the thread does when it stops: dispatch what the hosted consumers hold, then close them.
  int work = 0;
  for (Consumer* consumer : hosted_) {
    const Lane& lane = *lanes_[consumer->index()];
    if (lane.spill_empty() && consumer->CloseIfEmpty()) continue;
    for (int round = 0; round < 4; ++round) {
      int n;
      {
        const HostedDispatchScope dispatching(&Poller::ServeMailbox, this);
        n = DispatchHosted(*consumer);
      }
      if (n == 0) break;
      work += n;
    }
  }
  return work;
}

int Poller::PrepareSleep() noexcept {
  if (driver_.load(std::memory_order_relaxed) == ThreadToken()) return -EBUSY;
  if (!TryDrive()) return 0;
  if (KickOtherSleeper()) return 0;
  int verdict = 1;
  if (sleep_prepared_ && !parker_.sleeping()) {
    // Prepared, and a Wake took it since: the fd was written (an edge-triggered epoll may have
    // reported it already). Read it, and have the engine poll.
    EndSleep();
    verdict = 0;
  } else if (wake_owed_) {
    EndSleep();
  }
  if (verdict == 0 || sleep_prepared_ || wake_owed_) {
    // Still prepared with no Wake since (it writes the fd), or a write is still on its way
    // (the fd will be readable): sleeping stays safe; keep the bound of the first verdict.
    if (verdict != 0 && bounded_sleep_) verdict = 2;
  } else {
    bool busy;
    {
      const RuntimeThreadScope runtime(true);
      parker_.Prepare();  // from here a Wake writes the fd
      ChaosPoint();
      if (stopped_.load(std::memory_order_relaxed)) {
        busy = HostedPending() || mailbox_.pending();
      } else {
        ArmAll();
        // S6: completions that arrived before arming raise no event: poll once more. A full
        // consumer writes the fd when it frees room (AskForRoom).
        busy = AskForRoom() || PollAll() > 0 || mailbox_.pending() ||
               inbox_pending_.load(std::memory_order_seq_cst) || HostedPending() || UnparkPending();
      }
    }
    if (busy) {
      if (!parker_.TryCancel()) wake_owed_ = true;
      verdict = 0;
    } else {
      // As the thread's bounded sleeps: a failed arm or channel (no event may come). The fd
      // still wakes it earlier.
      bounded_sleep_ = arm_failed_ || notifications_broken_.load(std::memory_order_relaxed);
      sleep_prepared_ = true;
      sleeper_ = ThreadToken();
      verdict = bounded_sleep_ ? 2 : 1;
      Count(sleeps_, 1);
    }
  }
  Release();
  return verdict;
}

void Poller::ServeMailbox(void* self) {
  Poller* poller = static_cast<Poller*>(self);
  if (poller->mailbox_.pending()) poller->mailbox_.RunPosted();
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
  lane.PopFront(n);
  NoteSpill(consumer.index());
  consumer.DispatchLane(lane, at, n, begin + n);
  return static_cast<int>(n);
}

bool Poller::HostedPending() const noexcept {
  for (const Consumer* consumer : hosted_) {
    if (consumer->Pending() || !lanes_[consumer->index()]->spill_empty()) return true;
  }
  return false;
}

void Poller::AddCq(CqRecord* cq) {
  RunSync([&] {
    cqs_.push_back(cq);
    // Room for every CQ to park, so that parking (in PollAll) never allocates.
    parked_.reserve(cqs_.size() + parked_.size());
  });
}

void Poller::ReturnCq(CqRecord* cq) { AddCq(cq); }

uint64_t Poller::RemoveCq(CqRecord* cq) {
  uint64_t taken = 0;
  RunSync([&] {
    std::erase(cqs_, cq);
    if (cq->parked) {
      std::erase(parked_, cq);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
    }
    cq->parked = false;
    cq->empty_run = 0;
    if (cq->poll_failed) return;
    // No live registration uses it (the control path checked): everything left is an orphan.
    for (;;) {
      int n = cq->cq->Poll(options_.poll_batch, wcs_.get());
      if (n <= 0) break;
      Count(cq->completions, n);
      Count(completions_, n);
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs_[i];
        RouteFacts facts;  // no live registration uses the CQ: nothing is known
        if (cq->awaited_markers != 0) facts.fence = fences_.Take(cq, wc);
        if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) orphans_.Take({&wc, 1});
      }
      taken += n;
    }
  });
  return taken;
}

Status Poller::ResizeCq(CqRecord* cq, int depth) {
  Status status;
  RunSync([&] {
    status = cq->cq->Resize(depth);
    // Whether a resize keeps a pending arm is the device's business: poll it again, and arm it
    // afresh before it parks or the poller sleeps (arming an armed CQ is harmless).
    if (cq->parked) {
      std::erase(parked_, cq);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
      cq->parked = false;
      cqs_.push_back(cq);
    }
    cq->empty_run = 0;
    cq->armed.store(false, std::memory_order_seq_cst);
  });
  return status;
}

void Poller::AddUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (CqRecord::Use& use : cq->uses) {
      if (use.consumer == consumer) {
        ++use.count;
        return;
      }
    }
    cq->uses.push_back({consumer, 1});
  });
}

void Poller::DropUse(CqRecord* cq, uint32_t consumer) {
  RunSync([&] {
    for (size_t i = 0; i < cq->uses.size(); ++i) {
      if (cq->uses[i].consumer == consumer && --cq->uses[i].count == 0) {
        cq->uses.erase(cq->uses.begin() + i);
        return;
      }
    }
  });
}

void Poller::PurgeDead(uint32_t consumer) {
  RunSync([&] {
    auto route = [&](ItemKind kind, uint32_t slot, uint32_t generation) {
      RouteFacts facts{.kind = kind};
      if (kind != ItemKind::kListenerEvent) {  // a listener's event is nobody's registration's
        const uint64_t state = slots_.slot(slot).state.load(std::memory_order_acquire);
        facts.live = StateLiveAs(state, generation);
      }
      return Route(RouteStage::kConsumer, facts);
    };
    Lane& lane = *lanes_[consumer];
    lane.Filter([&](const EntryMeta& meta, uint32_t at) {
      const Disposal disposal = route(meta.kind, meta.slot, meta.generation);
      if (disposal == Disposal::kOrphan) orphans_.Take({&lane.wc(at), 1});
      if (disposal == Disposal::kReleaseEvent) ReleaseEventPart(lane.join(at));
      return Runs(disposal);
    });
    std::erase_if(deferred_, [&](const PostedEvent& posted) {
      const Item& item = posted.item;
      if (posted.consumer != consumer) return false;
      if (Runs(route(item.kind, item.slot, item.generation))) return false;
      ReleaseEventPart(posted.item.join);  // deferred entries are events
      return true;
    });
    NoteSpill(consumer);
    // A plain Unregister's fences catch up now that nothing is routed to the QP any more.
    for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
      for (CqRecord* cq : *list) {
        if (cq->catch_ups != 0) CatchUpFences(cq);
      }
    }
  });
}

void Poller::FenceRetired(const TeardownState* ending, uint32_t qp_num, const RetiredSide* sides,
                          int n) {
  RunSync([&] {
    // On this thread, between passes: `polled` holds every marker a pass has taken so far.
    const uint32_t posted = ending != nullptr ? ending->markers : 0;
    const uint32_t polled = ending != nullptr ? ending->polled.load(std::memory_order_relaxed) : 0;
    for (int k = 0; k < n; ++k) {
      const RetiredSide& side = sides[k];
      Fence fence;
      fence.cq = side.cq;
      fence.qp_num = qp_num;
      fence.unfenced = side.unfenced;
      fence.commit = side.commit;
      if ((posted & side.marker_bit) != 0 && (polled & side.marker_bit) == 0) {
        fence.marker = side.marker;
      }
      fences_.Add(fence, /*catch_up=*/ending == nullptr);
    }
  });
}

bool Poller::FenceForReuse(CqRecord* cq, uint32_t qp_num) {
  bool clear = true;
  RunSync([&] {
    if (!fences_.Holds(cq, qp_num)) return;
    fences_.StartCatchUps(cq, qp_num);
    CatchUpFences(cq);
    clear = !fences_.Holds(cq, qp_num);
  });
  return clear;
}

void Poller::DropFences(CqRecord* cq) {
  RunSync([&] { fences_.DropCq(cq); });
}

void Poller::SettleFences(CqRecord* cq) {
  RunSync([&] { CatchUpFences(cq); });
}

void Poller::CatchUpFences(CqRecord* cq) noexcept {
  // After Stop the lanes have been handed over for good: nothing is polled into them any more.
  if (stop_.load(std::memory_order_relaxed) || stopped_.load(std::memory_order_relaxed)) return;
  // A parked CQ is polled too (it stays parked: its next completion raises an event). PollOne
  // advances the catch-ups and ends them once it finds the CQ empty or a depth has come out.
  while (cq->catch_ups != 0 && !cq->poll_failed) {
    ChaosPoint();
    const int room = RoomFor(*cq);
    if (room == 0) return;  // a consumer the CQ shares is full: later passes go on
    if (PollOne(cq, room) < 0) return;
  }
}

bool Poller::PostEvent(uint32_t consumer, const Item& item, uint32_t cq_a, uint32_t cq_b) {
  std::unique_lock<std::mutex> lock(inbox_mu_);
  if (!inbox_open_) {
    // The thread has stopped (Shutdown): nothing it polled is still held, so hand it over now.
    Item copy = item;
    return consumers_[consumer]->PushIfOpen(tokens_[consumer], copy);
  }
  inbox_.push_back({consumer, item, {cq_a, cq_b}});
  inbox_pending_.store(true, std::memory_order_seq_cst);
  lock.unlock();
  parker_.Wake();
  return true;
}

void Poller::NotificationsBroken() noexcept {
  notifications_broken_.store(true, std::memory_order_seq_cst);
  UnparkAll();
}

void Poller::Run() {
  MarkRuntimeThread();
  PinAndNameThread(options_.poller_cpus.empty() ? -1 : options_.poller_cpus[index_],
                   "cqd-poll" + std::to_string(index_));
  Clock::time_point idle_since;
  bool idle = false;
  for (;;) {
    if (mailbox_.pending()) mailbox_.RunPosted();
    if (stop_.load(std::memory_order_acquire)) break;
    bool worked = false;
    if (inbox_pending_.load(std::memory_order_acquire) || !deferred_.empty()) {
      worked |= PlaceEvents();
    }
    if (!listed_.empty()) worked |= Flush(false);
    if (UnparkPending()) Unpark();
    if (PollAll() > 0) worked = true;
    if (!hosted_.empty()) worked |= RunHosted() > 0;
    if (worked) {
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
}

void Poller::HandOverAll() {
  // Everything taken off the CQs so far, and every posted event, reaches a consumer (they
  // outlive the pollers' shutdown). PostEvent waits on inbox_mu_ meanwhile and afterwards hands
  // events over directly, behind everything this flush moved.
  std::lock_guard<std::mutex> lock(inbox_mu_);
  for (PostedEvent& posted : inbox_) deferred_.push_back(posted);
  inbox_.clear();
  Flush(/*force=*/true);
  // Behind everything the lanes handed over, each event on its own (it needs no lane room).
  for (PostedEvent& posted : deferred_) {
    consumers_[posted.consumer]->Reserve(1);
    consumers_[posted.consumer]->Push(tokens_[posted.consumer], &posted.item, 1);
  }
  deferred_.clear();
  inbox_open_ = false;
}

bool Poller::PlaceEvents() {
  if (inbox_pending_.exchange(false, std::memory_order_acq_rel)) {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    deferred_.insert(deferred_.end(), inbox_.begin(), inbox_.end());
    inbox_.clear();
  }
  // In posting order. One that cannot be placed yet stays, and so do later ones for the same
  // consumer, which keeps each consumer's events in order.
  bool moved = false;
  size_t kept = 0;
  held_.assign(consumers_.size(), false);
  for (size_t i = 0; i < deferred_.size(); ++i) {
    PostedEvent& posted = deferred_[i];
    if (held_[posted.consumer] || !CatchUp(posted) || lanes_[posted.consumer]->room() == 0) {
      held_[posted.consumer] = true;
      deferred_[kept++] = posted;
      continue;
    }
    AppendEvent(posted.consumer, posted.item);
    moved = true;
  }
  deferred_.resize(kept);
  return moved;
}

bool Poller::CatchUp(PostedEvent& posted) noexcept {
  for (int k = 0; k < 2; ++k) {
    if (posted.cq_ids[k] == 0 || (posted.caught_up & (1u << k))) continue;
    // A parked CQ is polled too; it stays parked, since its next completion raises an event.
    CqRecord* cq = FindCq(posted.cq_ids[k]);
    while (cq != nullptr && !cq->poll_failed) {
      const int room = RoomFor(*cq);
      if (room == 0) return false;
      const int n = PollOne(cq, room);
      if (n > 0) posted.polled[k] += n;
      // Empty, or a whole depth taken: everything that was there when the event came is out.
      if (n < room || posted.polled[k] >= static_cast<uint64_t>(cq->cq->depth())) break;
    }
    posted.caught_up |= 1u << k;
  }
  return true;
}

int Poller::RoomFor(const CqRecord& cq) noexcept {
  int room = options_.poll_batch;
  for (const CqRecord::Use& use : cq.uses) {
    room = std::min<int>(room, static_cast<int>(lanes_[use.consumer]->room()));
  }
  return room;
}

CqRecord* Poller::FindCq(uint32_t id) noexcept {
  for (const std::vector<CqRecord*>* list : {&cqs_, &parked_}) {
    for (CqRecord* cq : *list) {
      if (cq->id == id) return cq;
    }
  }
  return nullptr;
}

int Poller::PollAll(int budget) noexcept {
  int found = 0;
  size_t kept = 0;
  size_t resume = SIZE_MAX;  // where the budget ran out: the next pass starts there
  Clock::time_point now{};   // read at most once per pass, by the first CQ that needs it
  for (size_t i = 0; i < cqs_.size(); ++i) {
    CqRecord* cq = cqs_[i];
    cqs_[kept++] = cq;
    if (cq->poll_failed) continue;
    if (found >= budget) {
      if (resume == SIZE_MAX) resume = kept - 1;
      continue;
    }
    int room = RoomFor(*cq);
    if (room == 0) {  // a consumer it shares is stalled: leave the completions in the CQ
      Count(backpressure_stalls_, 1);
      continue;
    }
    room = std::min(room, budget - found);
    int n = PollOne(cq, room);
    if (n != 0) {
      if (n > 0) found += n;
      cq->empty_run = 0;
      continue;
    }
    if (!may_park_ || cq->solicited_only) continue;
    if (++cq->empty_run <= kParkProbe) {
      if (cq->empty_run == kParkProbe) {
        if (now == Clock::time_point{}) now = Clock::now();
        cq->empty_since = now;
      }
      continue;
    }
    if (now == Clock::time_point{}) now = Clock::now();
    if (now - cq->empty_since < options_.cq_park_after) continue;
    if (TryPark(cq)) {
      --kept;
      cq->parked = true;
      parked_.push_back(cq);
      Count(parks_, 1);
      parked_count_.store(parked_.size(), std::memory_order_relaxed);
    }
  }
  cqs_.resize(kept);
  if (resume != SIZE_MAX) std::rotate(cqs_.begin(), cqs_.begin() + resume, cqs_.end());
  return found;
}

bool Poller::TryPark(CqRecord* cq) noexcept {
  cq->empty_run = 0;  // whatever happens, measure afresh
  if (notifications_broken_.load(std::memory_order_relaxed) ||
      cq->device->failed.load(std::memory_order_relaxed)) {
    return false;
  }
  if (!cq->armed.load(std::memory_order_seq_cst)) {
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    Count(arms_, 1);
    if (cq->cq->RequestNotify(/*solicited_only=*/false) != 0) {
      cq->armed.store(false, std::memory_order_seq_cst);
      Count(arm_failures_, 1);
      return false;
    }
  }
  ChaosPoint();  // armed, not yet polled again
  // S6: a completion that came before the arm raises no event; only an empty CQ may park.
  const int room = RoomFor(*cq);
  return room > 0 && PollOne(cq, room) == 0;
}

void Poller::Unpark() noexcept {
  seen_cq_events_ = cq_events_.load(std::memory_order_seq_cst);
  const bool all = unpark_all_.exchange(false, std::memory_order_seq_cst);
  size_t kept = 0;
  for (CqRecord* cq : parked_) {
    if (all || !cq->armed.load(std::memory_order_seq_cst)) {
      cq->parked = false;
      cqs_.push_back(cq);
    } else {
      parked_[kept++] = cq;
    }
  }
  parked_.resize(kept);
  parked_count_.store(kept, std::memory_order_relaxed);
}

int Poller::PollOne(CqRecord* cq, int room) noexcept {
  // Every registered QP of the CQ goes to one consumer: poll straight into its lane. A poll into
  // a lane stops at the ring's edge; the rest of `room` is polled into the ring's start, so that
  // fewer than `room` taken still means the CQ is empty (CatchUp relies on it).
  const uint32_t direct = cq->uses.size() == 1 ? cq->uses[0].consumer : kNoConsumer;
  int taken = 0;
  for (;;) {
    int want = room - taken;
    ibv_wc* into = wcs_.get();
    if (direct != kNoConsumer) {
      Lane& lane = *lanes_[direct];
      want = std::min<int>(want, static_cast<int>(lane.contiguous()));
      into = &lane.wc(lane.tail_at());
    }
    const int n = cq->cq->Poll(want, into);
    Count(polls_, 1);
    if (n == 0) {
      if (taken == 0) Count(empty_polls_, 1);
      break;
    }
    if (n < 0) {  // CQ in error (overflow, device failure): only destroy works now (S11)
      cq->poll_failed = true;
      Count(cq->poll_errors, 1);
      if (taken == 0) return n;
      break;
    }
    Count(cq->completions, n);
    Count(completions_, n);
    if (stamp_) poll_stamp_ = NowNs32();
    if (direct != kNoConsumer) {
      RouteInLane(cq, direct, n);
    } else {
      RouteCompletions(cq, 0, n);
    }
    taken += n;
    if (n < want || taken == room) break;
  }
  // Fewer than `room` taken: the CQ was found empty (fences.h's catch-ups end there).
  if (cq->catch_ups != 0 && !cq->poll_failed) fences_.Polled(cq, taken, taken < room);
  if (taken > 0) Flush(false);
  return taken;
}

void Poller::LookUpBatch(CqRecord* cq, const ibv_wc* wcs, int n) noexcept {
  // Independent loads, one pass ahead of routing, so that their misses overlap.
  const QpTable& table = cq->device->qps;
  uint32_t last_qp = kNoQp;
  const Slot* last = nullptr;
  for (int i = 0; i < n; ++i) {
    const uint32_t qp_num = wcs[i].qp_num;
    if (qp_num != last_qp) {
      last_qp = qp_num;
      last = table.Lookup(qp_num);
      if (last != nullptr) __builtin_prefetch(last);
    }
    batch_slots_[i] = last;
  }
}

// The poll's facts about `slot`, found for `qp_num` on `cq`'s device, whose state the caller
// read (acquire) as `state` before this reads the slot's other fields.
static inline void ReadSlotFacts(const CqRecord* cq, uint32_t qp_num, const Slot& slot,
                                 uint64_t state, RouteFacts& facts) noexcept {
  facts.known = slot.Holds(cq->device->id, qp_num);
  facts.live = StateLive(state);
  facts.uses_cq = slot.Uses(cq->id);
  facts.draining = StateDraining(state);
}

inline uint32_t Poller::Classify(CqRecord* cq, const ibv_wc& wc, const Slot* slot,
                                 RouteCache& cache, EntryMeta& meta) noexcept {
  RouteFacts facts;
  if (cq->awaited_markers != 0) [[unlikely]] {
    facts.fence = fences_.Take(cq, wc);  // a retired QP's marker or what it flushed before it
  } else if (wc.qp_num == cache.qp_num) {
    meta = cache.meta;  // the same facts as its QP's previous completion in this poll
    return cache.consumer;
  }
  uint64_t state = 0;
  if (facts.fence == FenceList::Taken::kNotFenced && slot != nullptr) {
    state = slot->state.load(std::memory_order_acquire);
    ReadSlotFacts(cq, wc.qp_num, *slot, state, facts);
  }
  TeardownState* teardown = nullptr;
  if (facts.draining && facts.live) [[unlikely]] {
    // Non-null while the state says draining: a teardown nulls it only after the state died, and
    // makes its fences (FenceRetired, on this thread between two passes) before that, so a
    // marker is either marked `polled` here or taken by its fence above.
    teardown = slot->teardown.load(std::memory_order_acquire);
    const uint64_t marker = reinterpret_cast<uint64_t>(teardown);
    facts.is_marker = marker != 0 && (wc.wr_id == marker || wc.wr_id == marker + 1);
  }
  switch (Route(RouteStage::kPoll, facts)) {
    case Disposal::kFenceTaken:
      return kTaken;
    case Disposal::kOrphan:
      return kOrphan;
    case Disposal::kNoteMarker:
      teardown->polled.fetch_or(wc.wr_id == teardown->send_marker() ? TeardownState::kSendMarker
                                                                    : TeardownState::kRecvMarker,
                                std::memory_order_relaxed);
      meta = {slot->index, StateGeneration(state), ItemKind::kTeardownMarker, 1, poll_stamp_};
      return StateConsumer(state);
    default:
      break;
  }
  meta = {slot->index, StateGeneration(state), ItemKind::kCompletion, 1, poll_stamp_};
  // The next completions of this QP in the poll route the same way (the consumer re-checks the
  // registration before it calls the handler, as it does for every run). A draining QP's are
  // each looked at: any may be its marker.
  if (!facts.draining) cache = {wc.qp_num, StateConsumer(state), meta};
  return StateConsumer(state);
}

void Poller::RouteInLane(CqRecord* cq, uint32_t consumer, int n) noexcept {
  Lane& lane = *lanes_[consumer];
  const uint32_t base = lane.tail_at();
  ibv_wc* wcs = &lane.wc(base);
  EntryMeta* metas = &lane.meta(base);
  LookUpBatch(cq, wcs, n);
  // The common case, a run of one QP's completions at a time: one state read per run, its entries
  // stay where the poll put them. Anything else (a CQ awaiting a retired QP's marker, a draining
  // QP, a completion for another consumer) finishes on the general path.
  uint32_t kept = 0;  // entries [0, kept) stay: routed to `consumer`
  uint32_t i = 0;
  const uint32_t count = static_cast<uint32_t>(n);
  while (i < count && cq->awaited_markers == 0) {
    const uint32_t qp_num = wcs[i].qp_num;
    uint32_t j = i + 1;
    while (j < count && wcs[j].qp_num == qp_num) ++j;
    const Slot* slot = batch_slots_[i];
    RouteFacts facts;
    uint64_t state = 0;
    if (slot != nullptr) {
      state = slot->state.load(std::memory_order_acquire);
      ReadSlotFacts(cq, qp_num, *slot, state, facts);
    }
    if (Route(RouteStage::kPoll, facts) == Disposal::kOrphan) {
      orphans_.Take({wcs + i, j - i});
      i = j;
      continue;
    }
    // A draining QP's entries may hold its marker, and another consumer's go elsewhere: the
    // general path looks at each.
    if (facts.draining || StateConsumer(state) != consumer) [[unlikely]]
      break;
    EntryMeta meta{slot->index, StateGeneration(state), ItemKind::kCompletion, 0, poll_stamp_};
    for (; i < j; ++i) {
      if (kept != i) wcs[kept] = wcs[i];  // close the gap an orphan left
      meta.run = static_cast<uint16_t>(j - i);
      metas[kept++] = meta;
    }
  }
  RouteCache cache;
  for (; i < count; ++i) {
    EntryMeta& meta = metas[kept];
    const uint32_t to = Classify(cq, wcs[i], batch_slots_[i], cache, meta);
    if (to == consumer) {
      if (kept != i) wcs[kept] = wcs[i];
      ++kept;
    } else if (to == kOrphan) {
      orphans_.Take({&wcs[i], 1});
    } else if (to != kTaken) [[unlikely]] {
      // Unreachable while `uses` is kept (a live QP's consumer is among its CQ's uses); should
      // that ever not hold, the rest of the poll takes the general path, behind what stays.
      const EntryMeta moved = meta;
      lane.Advance(kept);
      if (kept > 0) ListLane(consumer);
      const uint32_t rest = count - i;
      std::copy(&wcs[i], &wcs[i] + rest, wcs_.get());
      AppendCompletion(to, moved, wcs_[0]);
      RouteCompletions(cq, 1, static_cast<int>(rest));
      return;
    }
  }
  lane.Advance(kept);
  if (kept > 0) ListLane(consumer);
}

void Poller::RouteCompletions(CqRecord* cq, int first, int end) noexcept {
  LookUpBatch(cq, &wcs_[first], end - first);
  RouteCache cache;
  for (int i = first; i < end; ++i) {
    const ibv_wc& wc = wcs_[i];
    EntryMeta meta;
    const uint32_t to = Classify(cq, wc, batch_slots_[i - first], cache, meta);
    if (to == kTaken) continue;
    if (to == kOrphan) {
      orphans_.Take({&wc, 1});
      continue;
    }
    AppendCompletion(to, meta, wc);
  }
}

void Poller::ListLane(uint32_t consumer) noexcept {
  Lane& lane = *lanes_[consumer];
  if (!lane.listed) {
    lane.listed = true;
    listed_.push_back(consumer);
  }
}

void Poller::AppendCompletion(uint32_t consumer, const EntryMeta& meta, const ibv_wc& wc) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.room() == 0) [[unlikely]] {
    // A CQ's completions go only to consumers among its uses, whose room bounded the poll; this
    // is the last line of defence should that ever not hold: the spill is handed over past the
    // queue bound, and this completion behind it on its own.
    FlushOne(consumer, /*force=*/true);
    Item item;
    item.wc = wc;
    item.slot = meta.slot;
    item.generation = meta.generation;
    item.kind = meta.kind;
    item.stamp = meta.stamp;
    consumers_[consumer]->Reserve(1);
    consumers_[consumer]->Push(tokens_[consumer], &item, 1);
    return;
  }
  const uint32_t at = lane.tail_at();
  lane.wc(at) = wc;
  lane.meta(at) = meta;
  lane.Append();
  ListLane(consumer);
}

void Poller::AppendEvent(uint32_t consumer, const Item& item) noexcept {
  Lane& lane = *lanes_[consumer];  // the caller saw room()
  const uint32_t at = lane.tail_at();
  lane.SetJoin(at, item.join);
  lane.meta(at) = {item.slot, item.generation, item.kind, 1, 0};
  lane.Append();
  ListLane(consumer);
}

bool Poller::Flush(bool force) noexcept {
  bool moved = false;
  size_t kept = 0;
  for (size_t i = 0; i < listed_.size(); ++i) {
    uint32_t consumer = listed_[i];
    Lane& lane = *lanes_[consumer];
    // A run-to-completion consumer of this thread with nothing queued is dispatched straight
    // from the spill (DispatchHosted), unless the spill fills up: then the queue takes it.
    const bool direct =
        lane.direct && !force && !lane.spill_full() && !consumers_[consumer]->Pending();
    if (!direct) moved |= FlushOne(consumer, force);
    NoteSpill(consumer);
    if (lane.spill_empty()) {
      lane.listed = false;
    } else {
      listed_[kept++] = consumer;
    }
  }
  listed_.resize(kept);
  return moved;
}

bool Poller::FlushOne(uint32_t consumer, bool force) noexcept {
  Lane& lane = *lanes_[consumer];
  if (lane.spill_empty()) return false;
  Consumer& c = *consumers_[consumer];
  const uint32_t n = lane.spill_size();
  size_t take = n;
  if (force) {
    c.Reserve(n);
  } else {
    take = c.ReserveUpTo(n);
    if (take == 0) return false;
  }
  Item item;
  item.kind = ItemKind::kLaneRun;
  item.run = {lane.published(), static_cast<uint32_t>(take), static_cast<uint32_t>(index_),
              lane.TakeFiltered()};
  ChaosPoint();  // reserved, not yet pushed
  c.Push(tokens_[consumer], &item, 1);
  lane.PopFront(static_cast<uint32_t>(take));
  return true;
}

void Poller::NoteSpill(uint32_t consumer) noexcept {
  Lane& spill = *lanes_[consumer];
  uint64_t size = spill.spill_size();
  spill.depth_stat.store(size, std::memory_order_relaxed);
  if (size > spill.high_water.load(std::memory_order_relaxed)) {
    spill.high_water.store(size, std::memory_order_relaxed);
  }
  if (spill.spill_full() != spill.stalled) {  // a stall starts or ends: rare: read the clock
    Clock::time_point now = Clock::now();
    spill.stalled = spill.spill_full();
    if (spill.stalled) {
      spill.full_since = now;
      spill.stalled_since_ns.store(
          std::max<int64_t>(
              1,
              std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()),
          std::memory_order_relaxed);
      Count(spill.stalls, 1);
    } else {
      Count(spill.stalled_ns,
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - spill.full_since).count());
      spill.stalled_since_ns.store(0, std::memory_order_relaxed);
    }
  }
}

bool Poller::AskForRoom() noexcept {
  for (uint32_t consumer : listed_) {
    lanes_[consumer]->wants_room.store(true, std::memory_order_seq_cst);
  }
  for (const PostedEvent& posted : deferred_) {
    lanes_[posted.consumer]->wants_room.store(true, std::memory_order_seq_cst);
  }
  ChaosPoint();  // asked, not yet looked again
  // Room freed before the stores above was not woken for: look for it now. The fence orders the
  // stores before the loads of the consumers' depth and released positions (Dekker, with the
  // consumer's seq_cst release of room and its load of wants_room).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return Flush(false) || (!deferred_.empty() && PlaceEvents());
}

void Poller::TrySleep() noexcept {
  uint32_t ticket = parker_.Prepare();
  ChaosPoint();  // announced, not yet re-checked
  ArmAll();
  // S6: completions that arrived before arming raise no event: poll once more. A full consumer
  // wakes this thread when it frees room (AskForRoom), so the sleep need not be bounded for it.
  if (AskForRoom() || PollAll() > 0 || mailbox_.pending() ||
      inbox_pending_.load(std::memory_order_seq_cst) || HostedPending() || UnparkPending() ||
      stop_.load(std::memory_order_seq_cst)) {
    parker_.Cancel();
    return;
  }
  Count(sleeps_, 1);
  if (arm_failed_ || notifications_broken_.load(std::memory_order_relaxed)) {
    parker_.ParkFor(ticket, kRecheckUnarmed);
  } else {
    parker_.Park(ticket);
  }
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
  return s;
}

void Poller::AddSpillStats(uint32_t consumer, ConsumerStats& out) const {
  const Lane& spill = *lanes_[consumer];
  out.spill_depth += spill.depth_stat.load(std::memory_order_relaxed);
  out.spill_high_water =
      std::max(out.spill_high_water, spill.high_water.load(std::memory_order_relaxed));
  out.stalls += spill.stalls.load(std::memory_order_relaxed);
  out.stalled_ns += spill.stalled_ns.load(std::memory_order_relaxed);
  // The stall in progress counts too, so that an alert on stalled time sees a stuck consumer.
  if (const int64_t since = spill.stalled_since_ns.load(std::memory_order_relaxed); since != 0) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const uint64_t stall = now > since ? static_cast<uint64_t>(now - since) : 0;
    out.stalled_ns += stall;
    out.stall_ns = std::max(out.stall_ns, stall);
  }
}

}  // namespace cqd::internal
