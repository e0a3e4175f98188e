// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/chaos.h"

#ifdef CQD_CHAOS

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace cqd::internal {
namespace {

uint64_t Seed() noexcept {
  static const uint64_t seed = [] {
    const char* env = getenv("CQD_CHAOS_SEED");
    uint64_t s =
        env != nullptr
            ? strtoull(env, nullptr, 10)
            : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    fprintf(stderr, "cqd chaos: CQD_CHAOS_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// splitmix64: a good generator from any seed, one multiply-xorshift chain per draw.
uint64_t Next(uint64_t& state) noexcept {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::atomic<uint64_t> g_threads{0};

}  // namespace

void ChaosPoint() noexcept {
  thread_local uint64_t state =
      Seed() ^ (0x2545f4914f6cdd1dULL * (g_threads.fetch_add(1, std::memory_order_relaxed) + 1));
  const uint64_t r = Next(state);
  if ((r & 63) != 0) return;  // most calls: no pause
  switch ((r >> 6) & 15) {
    case 0:  // a sleep of up to 200 us: another thread runs meanwhile
      std::this_thread::sleep_for(std::chrono::microseconds((r >> 10) % 200));
      return;
    case 1:
    case 2:
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
      sched_yield();
      return;
    default: {  // a spin of up to ~2 us
      const uint64_t spins = (r >> 10) % 2000;
      for (volatile uint64_t i = 0; i < spins; i = i + 1) {
      }
      return;
    }
  }
}

}  // namespace cqd::internal

#endif  // CQD_CHAOS
