#include "benchmarks/pipelines.h"

#include <oneapi/tbb/concurrent_queue.h>

#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "cqd/runtime.h"
#include "runtime/sim_device.h"

namespace cqd::bench {
namespace {

constexpr int kDispatchBatch = 64;  // consumers take up to this many items at once (as cqd)

// The simulated QPs and their handlers, and the replay pattern: completions of the QPs round
// robin. The simulated device numbers a fresh device's QPs consecutively, so qp_num - base is
// the QP's index.
struct Source {
  Source(SimDevice& sim, SimCq* cq, int qps) : cq(cq) {
    for (int i = 0; i < qps; ++i) {
      this->qps.push_back(sim.CreateQp(cq, cq).value());
      handlers.push_back(std::make_unique<CountingHandler>());
      handler_table.push_back(handlers.back().get());
    }
    base = this->qps[0]->qp_num();
    for (int i = 0; i < qps; ++i) {
      if (this->qps[i]->qp_num() != base + static_cast<uint32_t>(i)) std::abort();
    }
    size_t length = std::max<size_t>(64, 4 * static_cast<size_t>(qps));
    pattern.resize(length);
    for (size_t i = 0; i < length; ++i) {
      pattern[i] = ibv_wc{};
      pattern[i].wr_id = i;
      pattern[i].opcode = IBV_WC_RECV;
      pattern[i].byte_len = 64;
      pattern[i].qp_num = base + static_cast<uint32_t>(i % qps);
    }
  }
  void StartReplay() { cq->Replay(pattern, UINT64_MAX / 4); }
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

  SimCq* cq;
  std::vector<SimQp*> qps;
  std::vector<std::unique_ptr<CountingHandler>> handlers;
  std::vector<CountingHandler*> handler_table;
  std::vector<ibv_wc> pattern;
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

// ---- limit: no handoff ----

class LimitPipeline : public Pipeline {
 public:
  explicit LimitPipeline(const PipelineConfig& c)
      : sim_(SimDevice::Create()), source_(*sim_, sim_->CreateCq(4096, nullptr).value(), c.qps) {
    source_.StartReplay();
    thread_ = std::thread([this, batch = c.batch, pin = c.pin] {
      Pin(pin, 0);
      std::vector<ibv_wc> wcs(batch);
      while (!stop_.load(std::memory_order_relaxed)) {
        int n = PollSim(source_.cq, batch, wcs.data());
        if (n > 0) source_.Dispatch(wcs.data(), n);
      }
    });
  }
  ~LimitPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_.Delivered(); }
  void Stop() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::shared_ptr<SimDevice> sim_;
  Source source_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- cqd ----

class CqdPipeline : public Pipeline {
 public:
  explicit CqdPipeline(const PipelineConfig& c) {
    RuntimeOptions options;
    options.pollers = 1;
    options.poll_batch = c.batch;
    options.busy_poll = true;
    options.consumers.assign(c.consumers, ConsumerOptions{});
    for (int i = 0; i < c.consumers; ++i) {
      options.consumers[i].queue_capacity = c.queue_capacity;
      if (c.pin) options.consumers[i].cpu = ConsumerCpu(i);
    }
    if (c.pin) options.poller_cpus = {0};
    rt_ = Runtime::Create(options).value();
    sim_ = SimDevice::Create();
    DeviceId dev = rt_->AddSimDevice(sim_).value();
    cq_ = rt_->CreateCq(dev, 0, CqOptions{.depth = 4096}).value();
    source_ = std::make_unique<Source>(*sim_, cq_.sim(), c.qps);
    for (int i = 0; i < c.qps; ++i) {
      registrations_.push_back(rt_->RegisterQp(*source_->qps[i], *source_->handlers[i],
                                               static_cast<ConsumerId>(i % c.consumers))
                                   .value());
    }
    source_->StartReplay();
  }
  ~CqdPipeline() override { Stop(); }
  uint64_t Delivered() const override { return source_->Delivered(); }
  void Stop() override {
    if (rt_ == nullptr) return;
    cq_.sim()->Replay({}, 0);
    (void)rt_->Shutdown();
    registrations_.clear();
    for (SimQp* qp : source_->qps) (void)sim_->DestroyQp(qp);
    (void)rt_->DestroyCq(cq_);
    rt_.reset();
  }

 private:
  std::unique_ptr<Runtime> rt_;
  std::shared_ptr<SimDevice> sim_;
  CqHandle cq_;
  std::unique_ptr<Source> source_;
  std::vector<Registration> registrations_;
};

// ---- handoffs through a queue per consumer ----

// A consumer's std::mutex + std::deque lane.
struct alignas(64) MutexLane {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ibv_wc> items;
  bool waiting = false;
};

void MutexPush(MutexLane& lane, const ibv_wc* wcs, size_t n, size_t capacity,
               const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(lane.mu);
  while (lane.items.size() + n > capacity && !stop.load(std::memory_order_relaxed)) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  lane.items.insert(lane.items.end(), wcs, wcs + n);
  bool wake = lane.waiting;
  lock.unlock();
  if (wake) lane.cv.notify_one();
}

size_t MutexPop(MutexLane& lane, ibv_wc* out, size_t max, const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(lane.mu);
  while (lane.items.empty()) {
    if (stop.load(std::memory_order_relaxed)) return 0;
    lane.waiting = true;
    lane.cv.wait_for(lock, std::chrono::milliseconds(1));
    lane.waiting = false;
  }
  size_t n = std::min(max, lane.items.size());
  std::copy_n(lane.items.begin(), n, out);
  lane.items.erase(lane.items.begin(), lane.items.begin() + n);
  return n;
}

// Poller thread + consumer threads; Lanes decides how items travel.
class HandoffPipeline : public Pipeline {
 public:
  explicit HandoffPipeline(const PipelineConfig& c)
      : config_(c),
        sim_(SimDevice::Create()),
        source_(*sim_, sim_->CreateCq(4096, nullptr).value(), c.qps),
        mutex_lanes_(c.consumers),
        tbb_lanes_(c.consumers) {
    for (auto& lane : tbb_lanes_) lane.set_capacity(c.queue_capacity);
    for (int i = 0; i < c.qps; ++i) ceph_connections_[source_.base + i] = i % c.consumers;
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
    for (auto& lane : tbb_lanes_) {  // a sentinel ends each blocked consumer
      ibv_wc sentinel{};
      sentinel.qp_num = UINT32_MAX;
      lane.push(sentinel);
    }
    for (auto& t : consumers_) t.join();
  }

 private:
  void Poll() {
    Pin(config_.pin, 0);
    const int consumers = config_.consumers;
    std::vector<ibv_wc> wcs(config_.batch);
    std::vector<std::vector<ibv_wc>> staged(consumers);
    while (!stop_.load(std::memory_order_relaxed)) {
      int n = PollSim(source_.cq, config_.batch, wcs.data());
      if (n <= 0) continue;
      if (config_.impl == "ceph") {
        for (int i = 0; i < n; ++i) {
          int consumer;
          {
            std::lock_guard<std::mutex> lock(ceph_mu_);  // the connection map, per completion
            consumer = ceph_connections_.find(wcs[i].qp_num)->second;
          }
          MutexPush(mutex_lanes_[consumer], &wcs[i], 1, config_.queue_capacity, stop_);
        }
        continue;
      }
      for (int i = 0; i < n; ++i) {
        int consumer = static_cast<int>((wcs[i].qp_num - source_.base) % consumers);
        if (config_.impl == "tbb") {
          while (!tbb_lanes_[consumer].try_push(wcs[i])) {  // bounded: wait for room
            if (stop_.load(std::memory_order_relaxed)) return;
            std::this_thread::yield();
          }
        } else {
          staged[consumer].push_back(wcs[i]);
        }
      }
      if (config_.impl == "mutex") {
        for (int c = 0; c < consumers; ++c) {
          if (staged[c].empty()) continue;
          MutexPush(mutex_lanes_[c], staged[c].data(), staged[c].size(), config_.queue_capacity,
                    stop_);
          staged[c].clear();
        }
      }
    }
  }

  void Consume(int index) {
    Pin(config_.pin, ConsumerCpu(index));
    ibv_wc buffer[kDispatchBatch];
    for (;;) {
      size_t n = 0;
      if (config_.impl == "tbb") {
        auto& lane = tbb_lanes_[index];
        lane.pop(buffer[0]);  // blocks
        if (buffer[0].qp_num == UINT32_MAX) return;
        n = 1;
        while (n < kDispatchBatch && lane.try_pop(buffer[n])) {
          if (buffer[n].qp_num == UINT32_MAX) {
            source_.Dispatch(buffer, n);
            return;
          }
          ++n;
        }
      } else {
        n = MutexPop(mutex_lanes_[index], buffer, kDispatchBatch, stop_);
        if (n == 0) return;  // stopped and empty
      }
      if (config_.impl == "ceph") {
        for (size_t i = 0; i < n; ++i) source_.Dispatch(&buffer[i], 1);  // one wc at a time
      } else {
        source_.Dispatch(buffer, n);
      }
    }
  }

  const PipelineConfig config_;
  std::shared_ptr<SimDevice> sim_;
  Source source_;
  std::vector<MutexLane> mutex_lanes_;
  std::vector<tbb::concurrent_bounded_queue<ibv_wc>> tbb_lanes_;
  std::mutex ceph_mu_;
  std::map<uint32_t, int> ceph_connections_;
  std::atomic<bool> stop_{false};
  std::thread poller_;
  std::vector<std::thread> consumers_;
};

}  // namespace

int ConsumerCpu(int i) {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus > 1 ? (1 + i) % cpus : 0;
}

std::unique_ptr<Pipeline> StartPipeline(const PipelineConfig& config) {
  if (config.impl == "limit") return std::make_unique<LimitPipeline>(config);
  if (config.impl == "cqd") return std::make_unique<CqdPipeline>(config);
  if (config.impl == "mutex" || config.impl == "tbb" || config.impl == "ceph") {
    return std::make_unique<HandoffPipeline>(config);
  }
  return nullptr;
}

}  // namespace cqd::bench
