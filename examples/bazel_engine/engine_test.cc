// SPDX-License-Identifier: BSD-2-Clause
// engine_test.cc: the example engine's own test: every completion injected on the simulated
// device reaches its handler exactly once, through a runtime-owned consumer (@cqd//:cqd) and
// through an engine-driven consumer that a oneTBB arena drains (@cqd//:cqd_tbb, ArenaConsumers).
#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cqd/runtime.h"
#include "cqd/tbb.h"
#include "sim_engine.h"

namespace {

constexpr uint32_t kCount = 2000;

void ExpectEachOnce(const std::vector<uint32_t>& seen) {
  ASSERT_EQ(seen.size(), kCount + 1);
  for (uint32_t k = 0; k < kCount; ++k) EXPECT_EQ(seen[k], 1u) << "wr_id " << k;
  EXPECT_EQ(seen[kCount], 0u) << "completions with an unknown wr_id, opcode or status";
}

TEST(BazelEngine, OwnedConsumerDeliversEachCompletionOnce) {
  cqd::RuntimeOptions options;
  options.pollers = 1;
  options.consumers = {cqd::ConsumerOptions{.name = "owned"}};
  auto rt = cqd::Runtime::Create(options);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();

  auto seen = engine::DeliverOnSim(**rt, /*consumer=*/0, kCount);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  ExpectEachOnce(*seen);
  const cqd::Stats stats = (*rt)->GetStats();
  ASSERT_EQ(stats.consumers.size(), 1u);
  EXPECT_EQ(stats.consumers[0].delivered, kCount);
  EXPECT_TRUE((*rt)->Shutdown().ok());
}

TEST(BazelEngine, ArenaConsumersDeliverEachCompletionOnce) {
  cqd::RuntimeOptions options;
  options.pollers = 1;
  options.consumers = {cqd::ConsumerOptions{.kind = cqd::ConsumerKind::kEngineDriven}};
  auto rt = cqd::Runtime::Create(options);
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  tbb::task_arena arena(2);
  auto drained = cqd::ArenaConsumers::Create(**rt, arena, {.consumers = {0}});
  ASSERT_TRUE(drained.ok()) << drained.status().ToString();

  auto seen = engine::DeliverOnSim(**rt, /*consumer=*/0, kCount);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  ExpectEachOnce(*seen);
  EXPECT_TRUE((*drained)->Stop().ok());
  EXPECT_GT((*drained)->GetStats().dispatched, 0u);
  EXPECT_TRUE((*rt)->Shutdown().ok());
}

}  // namespace
