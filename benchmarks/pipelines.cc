// SPDX-License-Identifier: BSD-2-Clause
#include "benchmarks/pipelines.h"

#include <oneapi/tbb/concurrent_queue.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "benchmarks/machine.h"
#include "cqd/runtime.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/base/parker.h"

namespace cqd::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kDispatchBatch = 64;  // consumers take up to this many at once (as cqd's default)
constexpr auto kIdleSpin = std::chrono::microseconds(20);  // as cqd's default idle_spin

// QPs and their handlers on one simulated device, and the replay patterns: each active CQ
// replays its QPs' completions round robin. The simulated device numbers a fresh device's QPs
// consecutively, so qp_num - base is the QP's index.
struct Source {
  Source(SimDevice& sim, const std::vector<SimCq*>& active, int qps, bool random_order = false)
      : cqs(active) {
    for (int i = 0; i < qps; ++i) {
      SimCq* cq = active[i % active.size()];
      this->qps.push_back(sim.CreateQp(cq, cq).value());
      handlers.push_back(std::make_unique<CountingHandler>());
      handler_table.push_back(handlers.back().get());
    }
    base = this->qps[0]->qp_num();
    for (int i = 0; i < qps; ++i) {
      if (this->qps[i]->qp_num() != base + static_cast<uint32_t>(i)) std::abort();
    }
    patterns.resize(active.size());
    for (size_t c = 0; c < active.size(); ++c) {
      const size_t mine = (qps - c + active.size() - 1) / active.size();  // QPs c, c+k, ...
      const size_t length = std::max<size_t>(64, 4 * mine);
      for (size_t i = 0; i < length; ++i) {
        ibv_wc wc{};
        wc.wr_id = i;
        wc.opcode = IBV_WC_RECV;
        wc.byte_len = 64;
        wc.qp_num = base + static_cast<uint32_t>(c + (i % mine) * active.size());
        patterns[c].push_back(wc);
      }
      if (random_order) std::shuffle(patterns[c].begin(), patterns[c].end(), std::mt19937(7 + c));
    }
  }
  void StartReplay() {
    for (size_t c = 0; c < cqs.size(); ++c) cqs[c]->Replay(patterns[c], UINT64_MAX / 4);
  }
  void StopReplay() {
    for (SimCq* cq : cqs) cq->Replay({}, 0);
  }
  uint64_t Delivered() const {
    uint64_t n = 0;
    for (const auto& h : handlers) n += h->count.load(std::memory_order_relaxed);
    return n;
  }
  // Calls each QP's handler once per run of its consecutive completions.
  void Dispatch(const ibv_wc* wcs, size_t n) const {
    size_t i = 0;
    while (i < n) {
      uint32_t qp = wcs[i].qp_num;
      size_t j = i + 1;
      while (j < n && wcs[j].qp_num == qp) ++j;
      handler_table[qp - base]->OnCompletions({wcs + i, j - i});
      i = j;
    }
  }

  std::vector<SimCq*> cqs;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<CountingHandler>> handlers;
  std::vector<CountingHandler*> handler_table;
  std::vector<std::vector<ibv_wc>> patterns;
  uint32_t base = 0;
};

void Pin(bool pin, int cpu) {
  if (!pin) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int PollSim(SimCq* cq, int n, ibv_wc* wc) {
  return static_cast<sim_internal::SimCqImpl*>(cq)->Poll(n, wc);
}

// ---- limit, limit2: no handoff ----

class LimitPipeline : public Pipeline {
 public:
  LimitPipeline(const PipelineConfig& c, int threads) {
    for (int t = 0; t < threads; ++t) {
      auto sim = SimDevice::Create();
      SimCq* cq = sim->CreateCq(4096, nullptr).value();
      const int qps = c.qps / threads + (t < c.qps % threads ? 1 : 0);
      sources_.push_back(std::make_unique<Source>(*sim, std::vector<SimCq*>{cq}, std::max(1, qps),
                                                  c.random_order));
      sims_.push_back(std::move(sim));
      sources_.back()->StartReplay();
    }
    for (int t = 0; t < threads; ++t) {
      threads_.emplace_back([this, t, batch = c.batch, pin = c.pin, base = c.cpu_base] {
        NameThread("limit" + std::to_string(t));
        Pin(pin, t == 0 ? base : ConsumerCpu(t - 1, base));
        const Source& source = *sources_[t];
        std::vector<ibv_wc> wcs(batch);
        while (!stop_.load(std::memory_order_relaxed)) {
          int n = PollSim(source.cqs[0], batch, wcs.data());
          if (n > 0) source.Dispatch(wcs.data(), n);
        }
      });
    }
  }
  ~LimitPipeline() override { Stop(); }
  uint64_t Delivered() const override {
    uint64_t n = 0;
    for (const auto& s : sources_) n += s->Delivered();
    return n;
  }
  void Stop() override {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  std::vector<std::shared_ptr<SimDevice>> sims_;
  std::vector<std::unique_ptr<Source>> sources_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// ---- handlers: the consumer's floor ----

// One thread on the first consumer's CPU calling the handlers over the replay pattern, batch by
// batch, with nothing polled and nothing handed over: what a consumer that did nothing but call
// this benchmark's handlers would deliver. No single-consumer pipeline can deliver more. One
// thread whatever `consumers` and `shards` say.
class HandlersPipeline : public Pipeline {
 public:
  explicit HandlersPipeline(const PipelineConfig& c) {
    sim_ = SimDevice::Create();
    SimCq* cq = sim_->CreateCq(4096, nullptr).value();
    source_ = std::make_unique<Source>(*sim_, std::vector<SimCq*>{cq}, std::max(1, c.qps),
                                       c.random_order);
    thread_ =
        std::thread([this, batch = static_cast<size_t>(c.batch), pin = c.pin, base = c.cpu_base] {
          NameThread("handlers");
          Pin(pin, ConsumerCpu(0, base));
          const std::vector<ibv_wc>& pattern = source_->patterns[0];
          size_t at = 0;
          while (!stop_.load(std::memory_order_relaxed)) {
            const size_t n = std::min(batch, pattern.size() - at);
            source_->Dispatch(pattern.data() + at, n);
            at += n;
            if (at == pattern.size()) at = 0;
          }
        });
  }
  ~HandlersPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_->Delivered(); }
  void Stop() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::shared_ptr<SimDevice> sim_;
  std::unique_ptr<Source> source_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- copy: the copy floor ----

// One single-producer single-consumer ring of completions per consumer, each side busy-polling:
// the poller polls a batch, copies each completion into its consumer's ring and publishes the
// new tail (one release store per consumer per batch); the consumer reads the tail (acquire),
// calls the handlers on up to kDispatchBatch completions at a time and publishes its head
// (release). Nothing else: no queue depth, no registration lookup, no sleeping. What moving each
// completion's cache lines to the other core costs a handoff, with the handlers.
struct alignas(64) CopyRing {
  explicit CopyRing(size_t capacity) : wcs(capacity) {}
  std::vector<ibv_wc> wcs;                    // capacity a power of two
  alignas(64) std::atomic<uint64_t> tail{0};  // written by the poller
  alignas(64) std::atomic<uint64_t> head{0};  // written by the consumer
};

class CopyFloorPipeline : public Pipeline {
 public:
  explicit CopyFloorPipeline(const PipelineConfig& c) : config_(c) {
    sim_ = SimDevice::Create();
    SimCq* cq = sim_->CreateCq(4096, nullptr).value();
    source_ = std::make_unique<Source>(*sim_, std::vector<SimCq*>{cq}, std::max(1, c.qps),
                                       c.random_order);
    size_t capacity = 64;
    while (capacity < std::max<size_t>(c.queue_capacity, 2 * static_cast<size_t>(c.batch))) {
      capacity *= 2;
    }
    for (int i = 0; i < std::max(1, c.consumers); ++i) {
      rings_.push_back(std::make_unique<CopyRing>(capacity));
    }
    source_->StartReplay();
    for (size_t i = 0; i < rings_.size(); ++i) {
      consumers_.emplace_back([this, i] { Consume(static_cast<int>(i)); });
    }
    poller_ = std::thread([this] { Poll(); });
  }
  ~CopyFloorPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_->Delivered(); }
  void Stop() override {
    if (!poller_.joinable()) return;
    stop_.store(true);
    poller_.join();
    for (auto& t : consumers_) t.join();
  }

 private:
  bool Stopping() const { return stop_.load(std::memory_order_relaxed); }

  void Poll() {
    NameThread("poll");
    Pin(config_.pin, config_.cpu_base);
    std::vector<ibv_wc> wcs(config_.batch);
    const size_t consumers = rings_.size();
    std::vector<uint64_t> tails(consumers, 0);
    std::vector<uint64_t> heads(consumers, 0);  // the last head read, refreshed when full
    while (!Stopping()) {
      const int n = PollSim(source_->cqs[0], config_.batch, wcs.data());
      if (n <= 0) continue;
      for (int i = 0; i < n; ++i) {
        const size_t c = consumers == 1 ? 0 : (wcs[i].qp_num - source_->base) % consumers;
        CopyRing& ring = *rings_[c];
        const uint64_t size = ring.wcs.size();
        while (tails[c] - heads[c] == size) {  // full: wait for the consumer
          heads[c] = ring.head.load(std::memory_order_acquire);
          if (Stopping()) return;
          if (tails[c] - heads[c] == size) internal::CpuRelax();
        }
        ring.wcs[tails[c] & (size - 1)] = wcs[i];
        ++tails[c];
      }
      for (size_t c = 0; c < consumers; ++c) {
        if (tails[c] != rings_[c]->tail.load(std::memory_order_relaxed)) {
          rings_[c]->tail.store(tails[c], std::memory_order_release);
        }
      }
    }
  }

  void Consume(int index) {
    NameThread("consume" + std::to_string(index));
    Pin(config_.pin, ConsumerCpu(index, config_.cpu_base));
    CopyRing& ring = *rings_[index];
    const uint64_t size = ring.wcs.size();
    uint64_t head = 0;
    while (!Stopping()) {
      const uint64_t tail = ring.tail.load(std::memory_order_acquire);
      if (tail == head) {
        internal::CpuRelax();
        continue;
      }
      while (head != tail) {
        const uint64_t at = head & (size - 1);
        const uint64_t n = std::min<uint64_t>({tail - head, size - at, kDispatchBatch});
        source_->Dispatch(ring.wcs.data() + at, n);
        head += n;
      }
      ring.head.store(head, std::memory_order_release);
    }
  }

  const PipelineConfig config_;
  std::shared_ptr<SimDevice> sim_;
  std::unique_ptr<Source> source_;
  std::vector<std::unique_ptr<CopyRing>> rings_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
  std::vector<std::thread> consumers_;
};

// ---- cqd, cqd_rtc ----

class CqdPipeline : public Pipeline {
 public:
  CqdPipeline(const PipelineConfig& c, bool run_to_completion) {
    const int shards = std::max(1, c.shards);
    RuntimeOptions options;
    options.pollers = shards;
    options.poll_batch = c.batch;
    options.busy_poll = c.busy_poll;
    const int consumers = shards > 1 ? shards : run_to_completion ? 1 : c.consumers;
    options.consumers.assign(consumers, ConsumerOptions{});
    for (int i = 0; i < consumers; ++i) {
      options.consumers[i].queue_capacity = c.queue_capacity;
      options.consumers[i].name = "c" + std::to_string(i);
      if (run_to_completion) {
        options.consumers[i].kind = ConsumerKind::kRunToCompletion;
        options.consumers[i].poller = i;  // one per shard
      } else if (c.pin) {
        options.consumers[i].cpu = shards > 1 ? 2 * i + 1 : ConsumerCpu(i);
      }
    }
    if (c.pin) {
      options.poller_cpus.clear();
      for (int s = 0; s < shards; ++s) options.poller_cpus.push_back(2 * s);
    }
    const int qps = c.qps * shards;
    options.max_registrations = std::max<uint32_t>(options.max_registrations, qps);
    rt_ = Runtime::Create(options).value();
    sim_ = SimDevice::Create();
    DeviceId dev = rt_->AddSimDevice(sim_).value();
    std::vector<SimCq*> active;
    const int active_cqs = shards > 1 ? shards : c.active_cqs;
    for (int i = 0; i < std::max(c.cqs, active_cqs); ++i) {
      cqs_.push_back(rt_->CreateCq(dev, i % shards, CqOptions{.depth = 4096}).value());
      if (i < active_cqs) active.push_back(cqs_.back().sim());
    }
    // QP i is on active CQ i % active_cqs, so with shards its CQ's poller and its consumer agree.
    source_ = std::make_unique<Source>(*sim_, active, qps, c.random_order);
    for (int i = 0; i < qps; ++i) {
      registrations_.push_back(rt_->RegisterQp(*source_->qps[i], *source_->handlers[i],
                                               static_cast<ConsumerId>(i % consumers),
                                               QpOptions{.send_wrs = 0, .recv_wrs = 0})
                                   .value());
    }
    source_->StartReplay();
  }
  ~CqdPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_->Delivered(); }
  void Stop() override {
    if (rt_ == nullptr) return;
    source_->StopReplay();
    (void)rt_->Shutdown();
    registrations_.clear();
    for (SimQp* qp : source_->qps) (void)sim_->DestroyQp(qp);
    for (CqHandle& cq : cqs_) (void)rt_->DestroyCq(cq);
    rt_.reset();
  }

 private:
  std::unique_ptr<Runtime> rt_;
  std::shared_ptr<SimDevice> sim_;
  std::vector<CqHandle> cqs_;
  std::unique_ptr<Source> source_;
  std::vector<Registration> registrations_;
};

// ---- handoffs through a lane per consumer ----

// Spin-then-block waiting, shared by the lanes below: the consumer spins on `ready()` for
// kIdleSpin, then sleeps on the lane's condition variable, having said so in `waiting` (under
// the lane's mutex, so the producer that sees `waiting` false knows the consumer will re-check).
template <typename Ready>
bool SpinThenBlock(std::mutex& mu, std::condition_variable& cv, bool& waiting,
                   const std::atomic<bool>& stop, Ready ready) {
  const Clock::time_point until = Clock::now() + kIdleSpin;
  for (int i = 0; !ready(); ++i) {
    if (stop.load(std::memory_order_relaxed)) return false;
    internal::CpuRelax();
    if (i % 64 == 63 && Clock::now() >= until) {
      std::unique_lock<std::mutex> lock(mu);
      waiting = true;
      cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return ready(); });
      waiting = false;
    }
  }
  return true;
}

// mutex: a preallocated vector per consumer, swapped out whole.
struct alignas(64) MutexLane {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ibv_wc> items;                // guarded by mu; capacity reserved up front
  bool waiting = false;                     // guarded by mu
  alignas(64) std::atomic<size_t> size{0};  // items.size(), for the consumer's spin
};

// tbb: pooled batches, one push per poll batch.
struct TbbBatch {
  uint32_t n = 0;
  ibv_wc wcs[256];
};
struct TbbLane {
  tbb::concurrent_bounded_queue<TbbBatch*> full;
  tbb::concurrent_queue<TbbBatch*> free;
  std::vector<std::unique_ptr<TbbBatch>> pool;
};

// ceph: a connection's own queue, and each worker's ready list of connections.
struct alignas(64) CephConn {
  std::mutex mu;
  std::vector<ibv_wc> wcs;  // guarded by mu
  bool queued = false;      // guarded by mu: on its worker's ready list
  int worker = 0;
};
struct alignas(64) CephWorker {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<CephConn*> ready;  // guarded by mu
  bool waiting = false;          // guarded by mu
  alignas(64) std::atomic<size_t> size{0};
};

class HandoffPipeline : public Pipeline {
 public:
  explicit HandoffPipeline(const PipelineConfig& c)
      : config_(c),
        sim_(SimDevice::Create()),
        source_(*sim_, {sim_->CreateCq(4096, nullptr).value()}, c.qps, c.random_order),
        mutex_lanes_(c.consumers),
        tbb_lanes_(c.consumers),
        ceph_workers_(c.consumers) {
    for (auto& lane : mutex_lanes_) lane.items.reserve(c.queue_capacity);
    const size_t batches = std::max<size_t>(4, c.queue_capacity / std::max(1, c.batch));
    for (auto& lane : tbb_lanes_) {
      lane.full.set_capacity(static_cast<std::ptrdiff_t>(batches));
      for (size_t i = 0; i < batches; ++i) {
        lane.pool.push_back(std::make_unique<TbbBatch>());
        lane.free.push(lane.pool.back().get());
      }
    }
    for (int i = 0; i < c.qps; ++i) {
      auto conn = std::make_unique<CephConn>();
      conn->worker = i % c.consumers;
      conn->wcs.reserve(1024);
      ceph_map_[source_.base + i] = conn.get();
      ceph_conns_.push_back(std::move(conn));
    }
    for (auto& w : ceph_workers_) w.ready.reserve(c.qps);
    source_.StartReplay();
    for (int i = 0; i < c.consumers; ++i) consumers_.emplace_back([this, i] { Consume(i); });
    poller_ = std::thread([this] { Poll(); });
  }
  ~HandoffPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_.Delivered(); }
  void Stop() override {
    if (!poller_.joinable()) return;
    stop_.store(true);
    poller_.join();
    for (auto& lane : tbb_lanes_) lane.full.push(nullptr);  // ends a blocked consumer
    for (auto& lane : mutex_lanes_) lane.cv.notify_all();
    for (auto& w : ceph_workers_) w.cv.notify_all();
    for (auto& t : consumers_) t.join();
  }

 private:
  bool Stopping() const { return stop_.load(std::memory_order_relaxed); }

  void Poll() {
    NameThread("poll");
    Pin(config_.pin, config_.cpu_base);
    const int consumers = config_.consumers;
    std::vector<ibv_wc> wcs(config_.batch);
    std::vector<std::vector<ibv_wc>> staged(consumers);
    for (auto& s : staged) s.reserve(config_.batch);
    std::vector<std::pair<CephConn*, std::vector<ibv_wc>>> polled;  // Ceph's per-batch grouping
    while (!Stopping()) {
      int n = PollSim(source_.cq(), config_.batch, wcs.data());
      if (n <= 0) continue;
      if (config_.impl == "ceph") {
        CephPass(wcs.data(), n, polled);
        continue;
      }
      for (int i = 0; i < n; ++i) {
        staged[(wcs[i].qp_num - source_.base) % consumers].push_back(wcs[i]);
      }
      for (int c = 0; c < consumers; ++c) {
        if (staged[c].empty()) continue;
        if (config_.impl == "tbb") {
          TbbPush(tbb_lanes_[c], staged[c]);
        } else {
          MutexPush(mutex_lanes_[c], staged[c]);
        }
        staged[c].clear();
      }
    }
  }

  void MutexPush(MutexLane& lane, const std::vector<ibv_wc>& wcs) {
    std::unique_lock<std::mutex> lock(lane.mu);
    while (lane.items.size() + wcs.size() > config_.queue_capacity) {  // full: wait for room
      lock.unlock();
      if (Stopping()) return;
      std::this_thread::yield();
      lock.lock();
    }
    lane.items.insert(lane.items.end(), wcs.begin(), wcs.end());
    lane.size.store(lane.items.size(), std::memory_order_release);
    const bool wake = lane.waiting;
    lock.unlock();
    if (wake) lane.cv.notify_one();
  }

  void TbbPush(TbbLane& lane, const std::vector<ibv_wc>& wcs) {
    TbbBatch* batch = nullptr;
    while (!lane.free.try_pop(batch)) {  // every batch in flight: wait for one back
      if (Stopping()) return;
      std::this_thread::yield();
    }
    batch->n = static_cast<uint32_t>(wcs.size());
    std::copy(wcs.begin(), wcs.end(), batch->wcs);
    lane.full.push(batch);
  }

  void CephPass(const ibv_wc* wcs, int n,
                std::vector<std::pair<CephConn*, std::vector<ibv_wc>>>& polled) {
    {
      std::lock_guard<std::mutex> lock(ceph_map_mu_);  // once per poll batch
      for (int i = 0; i < n; ++i) {
        CephConn* conn = ceph_map_.find(wcs[i].qp_num)->second;
        auto it = std::find_if(polled.begin(), polled.end(),
                               [&](const auto& p) { return p.first == conn; });
        if (it == polled.end()) {
          polled.emplace_back(conn, std::vector<ibv_wc>());
          it = polled.end() - 1;
        }
        it->second.push_back(wcs[i]);
      }
    }
    for (auto& [conn, group] : polled) {  // per connection: one append, one notification
      bool notify;
      {
        std::lock_guard<std::mutex> lock(conn->mu);
        conn->wcs.insert(conn->wcs.end(), group.begin(), group.end());
        notify = !conn->queued;
        conn->queued = true;
      }
      if (notify) {
        CephWorker& w = ceph_workers_[conn->worker];
        std::unique_lock<std::mutex> lock(w.mu);
        w.ready.push_back(conn);
        w.size.store(w.ready.size(), std::memory_order_release);
        const bool wake = w.waiting;
        lock.unlock();
        if (wake) w.cv.notify_one();
      }
    }
    polled.clear();
  }

  void Consume(int index) {
    NameThread("consume" + std::to_string(index));
    Pin(config_.pin, ConsumerCpu(index, config_.cpu_base));
    if (config_.impl == "tbb") return ConsumeTbb(tbb_lanes_[index]);
    if (config_.impl == "ceph") return ConsumeCeph(ceph_workers_[index]);
    MutexLane& lane = mutex_lanes_[index];
    std::vector<ibv_wc> taken;
    taken.reserve(config_.queue_capacity);
    for (;;) {
      auto ready = [&] { return lane.size.load(std::memory_order_acquire) > 0; };
      if (!SpinThenBlock(lane.mu, lane.cv, lane.waiting, stop_, ready)) return;
      {
        std::lock_guard<std::mutex> lock(lane.mu);
        lane.items.swap(taken);
        lane.size.store(0, std::memory_order_relaxed);
      }
      for (size_t i = 0; i < taken.size(); i += kDispatchBatch) {
        source_.Dispatch(taken.data() + i, std::min<size_t>(kDispatchBatch, taken.size() - i));
      }
      taken.clear();
    }
  }

  void ConsumeTbb(TbbLane& lane) {
    for (;;) {
      TbbBatch* batch = nullptr;
      lane.full.pop(batch);  // tbb's own spin-then-block
      if (batch == nullptr) return;
      source_.Dispatch(batch->wcs, batch->n);
      lane.free.push(batch);
    }
  }

  void ConsumeCeph(CephWorker& w) {
    std::vector<CephConn*> ready;
    std::vector<ibv_wc> wcs;
    wcs.reserve(1024);
    for (;;) {
      auto has = [&] { return w.size.load(std::memory_order_acquire) > 0; };
      if (!SpinThenBlock(w.mu, w.cv, w.waiting, stop_, has)) return;
      {
        std::lock_guard<std::mutex> lock(w.mu);
        w.ready.swap(ready);
        w.size.store(0, std::memory_order_relaxed);
      }
      for (CephConn* conn : ready) {  // Ceph's handle_rx_event: take the connection's wcs
        {
          std::lock_guard<std::mutex> lock(conn->mu);
          conn->wcs.swap(wcs);
          conn->queued = false;
        }
        source_.Dispatch(wcs.data(), wcs.size());
        wcs.clear();
      }
      ready.clear();
    }
  }

  const PipelineConfig config_;
  std::shared_ptr<SimDevice> sim_;
  struct OneCqSource : Source {
    using Source::Source;
    SimCq* cq() const { return cqs[0]; }
  } source_;
  std::vector<MutexLane> mutex_lanes_;
  std::vector<TbbLane> tbb_lanes_;
  std::vector<CephWorker> ceph_workers_;
  std::mutex ceph_map_mu_;
  std::map<uint32_t, CephConn*> ceph_map_;  // guarded by ceph_map_mu_
  std::vector<std::unique_ptr<CephConn>> ceph_conns_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
  std::vector<std::thread> consumers_;
};

}  // namespace

int ConsumerCpu(int i, int base) {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus > 1 ? (base + 1 + i) % cpus : 0;
}

namespace {

// `shards` copies of a one-poller pipeline, copy s placed from CPU 2s.
class ShardedPipeline : public Pipeline {
 public:
  explicit ShardedPipeline(const PipelineConfig& c) {
    for (int s = 0; s < c.shards; ++s) {
      PipelineConfig one = c;
      one.shards = 1;
      one.cpu_base = 2 * s;
      copies_.push_back(StartPipeline(one));
    }
  }
  uint64_t Delivered() const override {
    uint64_t n = 0;
    for (const auto& p : copies_) n += p->Delivered();
    return n;
  }
  void Stop() override {
    for (auto& p : copies_) p->Stop();
  }

 private:
  std::vector<std::unique_ptr<Pipeline>> copies_;
};

}  // namespace

std::unique_ptr<Pipeline> StartPipeline(const PipelineConfig& config) {
  const bool runtime = config.impl == "cqd" || config.impl == "cqd_rtc";
  const bool known = runtime || config.impl == "limit" || config.impl == "limit2" ||
                     config.impl == "mutex" || config.impl == "tbb" || config.impl == "ceph" ||
                     config.impl == "handlers" || config.impl == "copy";
  if (!known) return nullptr;
  if (config.impl == "handlers") return std::make_unique<HandlersPipeline>(config);
  if (config.shards > 1 && !runtime) return std::make_unique<ShardedPipeline>(config);
  if (config.impl == "limit") return std::make_unique<LimitPipeline>(config, 1);
  if (config.impl == "limit2") return std::make_unique<LimitPipeline>(config, 2);
  if (config.impl == "copy") return std::make_unique<CopyFloorPipeline>(config);
  if (config.impl == "cqd") return std::make_unique<CqdPipeline>(config, false);
  if (config.impl == "cqd_rtc") return std::make_unique<CqdPipeline>(config, true);
  if (config.impl == "mutex" || config.impl == "tbb" || config.impl == "ceph") {
    return std::make_unique<HandoffPipeline>(config);
  }
  return nullptr;
}

}  // namespace cqd::bench
