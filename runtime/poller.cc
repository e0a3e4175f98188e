#include "runtime/poller.h"

#include <chrono>
#include <thread>

#include "runtime/thread_role.h"

namespace cqd::internal {

Poller::Poller(int index, const RuntimeOptions& options, const std::vector<Consumer*>& consumers,
               const SlotPool& slots, OrphanSink& orphans)
    : index_(index),
      options_(options),
      consumers_(consumers),
      slots_(slots),
      orphans_(orphans),
      wcs_(std::make_unique<ibv_wc[]>(options.poll_batch)) {
  for (Consumer* consumer : consumers_) {
    tokens_.push_back(consumer->MakeProducerToken());
    stages_.push_back(Stage{std::make_unique<Item[]>(options.poll_batch), 0});
  }
  touched_.reserve(consumers_.size());
}

Poller::~Poller() { Stop(); }

void Poller::Start() {
  mailbox_.Open();
  thread_ = std::thread([this] { Run(); });
}

void Poller::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_seq_cst);
  parker_.Wake();
  thread_.join();
}

void Poller::RunSync(const std::function<void(std::vector<CqRecord*>&)>& fn) {
  mailbox_.RunSync([&] { fn(cqs_); }, [this] { parker_.Wake(); });
}

void Poller::Run() {
  MarkRuntimeThread();
  PinAndNameThread(options_.poller_cpus.empty() ? -1 : options_.poller_cpus[index_],
                   "cqd-poll" + std::to_string(index_));
  using Clock = std::chrono::steady_clock;
  Clock::time_point idle_since;
  bool idle = false;
  uint32_t stalls = 0;
  for (;;) {
    if (mailbox_.pending()) mailbox_.RunPosted();
    if (stop_.load(std::memory_order_acquire)) break;
    if (staged_) {
      if (!Flush(false)) {
        Count(stalls_, 1);
        Backoff(++stalls);
        continue;
      }
      staged_ = false;
      stalls = 0;
    }
    if (PollAll() > 0 || staged_) {
      idle = false;
      continue;
    }
    if (options_.busy_poll) continue;
    Clock::time_point now = Clock::now();
    if (!idle) {
      idle = true;
      idle_since = now;
    } else if (now - idle_since >= options_.idle_budget) {
      TrySleep();
      idle = false;
    }
  }
  // Everything polled so far reaches a consumer (they outlive the pollers' shutdown).
  Flush(true);
  mailbox_.Close();
}

void Poller::Backoff(uint32_t stalls) noexcept {
  if (stalls < 64) {
    CpuRelax();
  } else if (stalls < 1024) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // an engine not draining
  }
}

int Poller::PollAll() noexcept {
  int found = 0;
  for (CqRecord* cq : cqs_) {
    if (cq->poll_failed) continue;
    int n = cq->cq->Poll(options_.poll_batch, wcs_.get());
    Count(polls_, 1);
    if (n == 0) {
      Count(empty_polls_, 1);
      continue;
    }
    if (n < 0) {  // CQ in error (overflow, device failure): only destroy works now (S11)
      cq->poll_failed = true;
      Count(cq->poll_errors, 1);
      continue;
    }
    Count(cq->completions, n);
    Count(completions_, n);
    found += n;
    Route(cq, n);
    if (!Flush(false)) {
      staged_ = true;  // stop polling until the consumer has room
      break;
    }
  }
  return found;
}

void Poller::Route(CqRecord* cq, int n) noexcept {
  const QpTable& table = cq->device->qps;
  const DeviceId device = cq->device->id;
  const Slot* base = &slots_.slot(0);
  for (int i = 0; i < n; ++i) {
    const ibv_wc& wc = wcs_[i];
    const Slot* slot = table.Lookup(wc.qp_num);
    if (slot != nullptr) {
      uint64_t state = slot->state.load(std::memory_order_acquire);
      if (StateLive(state) && slot->Holds(device, wc.qp_num)) {
        uint32_t consumer = StateConsumer(state);
        Stage& stage = stages_[consumer];
        if (stage.count == 0) touched_.push_back(consumer);
        Item& item = stage.items[stage.count++];
        item.wc = wc;
        item.slot = static_cast<uint32_t>(slot - base);
        item.generation = StateGeneration(state);
        item.kind = ItemKind::kCompletion;
        continue;
      }
    }
    orphans_.Take({&wc, 1});
  }
}

bool Poller::Flush(bool force) noexcept {
  size_t kept = 0;
  for (uint32_t consumer : touched_) {
    Stage& stage = stages_[consumer];
    Consumer& c = *consumers_[consumer];
    if (force) {
      c.Reserve(stage.count);
    } else if (!c.TryReserve(stage.count)) {
      touched_[kept++] = consumer;
      continue;
    }
    c.Push(tokens_[consumer], stage.items.get(), stage.count);
    stage.count = 0;
  }
  touched_.resize(kept);
  return kept == 0;
}

void Poller::TrySleep() noexcept {
  uint32_t ticket = parker_.Prepare();
  for (CqRecord* cq : cqs_) {
    if (cq->poll_failed || cq->device->failed.load(std::memory_order_relaxed)) continue;
    if (cq->armed.load(std::memory_order_seq_cst)) continue;  // a notification is pending (S7)
    cq->armed.store(true, std::memory_order_seq_cst);  // before arming: the event may race us
    cq->cq->RequestNotify(cq->solicited_only);          // on failure stay "armed": no retry loop
    Count(arms_, 1);
  }
  // S6: completions that arrived before arming raise no event: poll once more.
  if (PollAll() > 0 || staged_ || mailbox_.pending() ||
      stop_.load(std::memory_order_seq_cst)) {
    parker_.Cancel();
    return;
  }
  Count(sleeps_, 1);
  parker_.Park(ticket);
}

PollerStats Poller::stats() const {
  PollerStats s;
  s.cpu = options_.poller_cpus.empty() ? -1 : options_.poller_cpus[index_];
  s.polls = polls_.load(std::memory_order_relaxed);
  s.empty_polls = empty_polls_.load(std::memory_order_relaxed);
  s.completions = completions_.load(std::memory_order_relaxed);
  s.arms = arms_.load(std::memory_order_relaxed);
  s.sleeps = sleeps_.load(std::memory_order_relaxed);
  s.backpressure_stalls = stalls_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace cqd::internal
