// SPDX-License-Identifier: BSD-2-Clause
// Micro-benchmarks of the pieces on cqd's hot path, each beside what it replaces:
//   registry lookup   cqd's two-level QpTable vs tbb::concurrent_hash_map vs std::unordered_map
//                     under a std::shared_mutex, for 1, 10^3 and 10^5 registered QPs
//   handoff per item  moodycamel bulk enqueue/dequeue (cqd's consumer queue) vs
//                     tbb::concurrent_bounded_queue vs std::mutex + std::deque
//   ack counter       AckCounter::Add from one and two threads
//
//   bazel run -c opt //benchmarks:micro
#include <benchmark/benchmark.h>
#include <oneapi/tbb/concurrent_hash_map.h>
#include <oneapi/tbb/concurrent_queue.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/core/consumer.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"

namespace cqd::internal {
namespace {

// `n` distinct random 24-bit qp_nums, each with its registration slot, and the lookups: every
// key once per cycle, in a random order (at least 4096 per cycle), so that with many QPs the
// lookups and the slots they touch miss the caches as a poller's would.
struct Keys {
  explicit Keys(int64_t n) : slots(std::make_unique<Slot[]>(n)) {
    std::mt19937 rng(42);
    std::unordered_set<uint32_t> seen;
    while (static_cast<int64_t>(registered.size()) < n) {
      uint32_t qp = rng() & 0xffffff;
      if (seen.insert(qp).second) registered.push_back(qp);
    }
    while (lookups.size() < 4096) {
      std::vector<uint32_t> cycle = registered;
      std::shuffle(cycle.begin(), cycle.end(), rng);
      lookups.insert(lookups.end(), cycle.begin(), cycle.end());
    }
  }
  uint32_t Next(size_t& i) const { return lookups[i++ % lookups.size()]; }
  std::vector<uint32_t> registered;
  std::vector<uint32_t> lookups;
  std::unique_ptr<Slot[]> slots;
};

// What the poller reads once it has the slot: its state word.
inline uint64_t Touch(const Slot* slot) { return slot->state.load(std::memory_order_acquire); }

void BM_LookupCqdTable(benchmark::State& state) {
  static std::unique_ptr<QpTable> table;
  static std::unique_ptr<Keys> keys;
  if (state.thread_index() == 0) {
    keys = std::make_unique<Keys>(state.range(0));
    table = std::make_unique<QpTable>();
    for (size_t i = 0; i < keys->registered.size(); ++i) {
      table->Set(keys->registered[i], &keys->slots[i]);
    }
  }
  size_t i = state.thread_index() * 97;
  for (auto _ : state) {
    benchmark::DoNotOptimize(Touch(table->Lookup(keys->Next(i))));
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_LookupTbbHashMap(benchmark::State& state) {
  using Map = tbb::concurrent_hash_map<uint32_t, Slot*>;
  static std::unique_ptr<Map> map;
  static std::unique_ptr<Keys> keys;
  if (state.thread_index() == 0) {
    keys = std::make_unique<Keys>(state.range(0));
    map = std::make_unique<Map>();
    for (size_t k = 0; k < keys->registered.size(); ++k) {
      map->insert({keys->registered[k], &keys->slots[k]});
    }
  }
  size_t i = state.thread_index() * 97;
  for (auto _ : state) {
    Map::const_accessor accessor;
    map->find(accessor, keys->Next(i));
    benchmark::DoNotOptimize(Touch(accessor->second));
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_LookupSharedMutexMap(benchmark::State& state) {
  static std::unique_ptr<std::unordered_map<uint32_t, Slot*>> map;
  static std::shared_mutex mu;
  static std::unique_ptr<Keys> keys;
  if (state.thread_index() == 0) {
    keys = std::make_unique<Keys>(state.range(0));
    map = std::make_unique<std::unordered_map<uint32_t, Slot*>>();
    for (size_t k = 0; k < keys->registered.size(); ++k) {
      (*map)[keys->registered[k]] = &keys->slots[k];
    }
  }
  size_t i = state.thread_index() * 97;
  for (auto _ : state) {
    std::shared_lock<std::shared_mutex> lock(mu);
    benchmark::DoNotOptimize(Touch(map->find(keys->Next(i))->second));
  }
  state.SetItemsProcessed(state.iterations());
}

constexpr int kBulk = 32;

void BM_HandoffMoodycamelBulk(benchmark::State& state) {
  ItemQueue queue(1 << 12);
  moodycamel::ProducerToken producer(queue);
  moodycamel::ConsumerToken consumer(queue);
  Item in[kBulk], out[kBulk];
  for (auto _ : state) {
    queue.try_enqueue_bulk(producer, in, kBulk);
    benchmark::DoNotOptimize(queue.try_dequeue_bulk(consumer, out, kBulk));
  }
  state.SetItemsProcessed(state.iterations() * kBulk);
}

void BM_HandoffTbbBoundedQueue(benchmark::State& state) {
  tbb::concurrent_bounded_queue<Item> queue;
  queue.set_capacity(1 << 12);
  Item item;
  for (auto _ : state) {
    for (int i = 0; i < kBulk; ++i) queue.push(item);
    for (int i = 0; i < kBulk; ++i) queue.try_pop(item);
  }
  state.SetItemsProcessed(state.iterations() * kBulk);
}

void BM_HandoffMutexDeque(benchmark::State& state) {
  std::mutex mu;
  std::deque<Item> queue;
  Item in[kBulk], out[kBulk];
  for (auto _ : state) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.insert(queue.end(), in, in + kBulk);
    }
    std::lock_guard<std::mutex> lock(mu);
    std::copy_n(queue.begin(), kBulk, out);
    queue.erase(queue.begin(), queue.begin() + kBulk);
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * kBulk);
}

void BM_AckCounterAdd(benchmark::State& state) {
  static AckCounter counter;
  uint64_t acks = 0;
  for (auto _ : state) {
    if (counter.Add(1, 64) > 0) ++acks;
  }
  benchmark::DoNotOptimize(acks);
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_LookupCqdTable)->Arg(1)->Arg(1000)->Arg(100000)->ThreadRange(1, 2);
BENCHMARK(BM_LookupTbbHashMap)->Arg(1)->Arg(1000)->Arg(100000)->ThreadRange(1, 2);
BENCHMARK(BM_LookupSharedMutexMap)->Arg(1)->Arg(1000)->Arg(100000)->ThreadRange(1, 2);
BENCHMARK(BM_HandoffMoodycamelBulk);
BENCHMARK(BM_HandoffTbbBoundedQueue);
BENCHMARK(BM_HandoffMutexDeque);
BENCHMARK(BM_AckCounterAdd)->ThreadRange(1, 2);

}  // namespace
}  // namespace cqd::internal

BENCHMARK_MAIN();
