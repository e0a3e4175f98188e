// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/event_join.h, the parts that need no poller: an EventJoin's parts (only
// dropping the last one says so) and holds (the last one frees it, and a freed CM event leaves
// its channel's count once, EventJoin::Finish), HeldEvents (CM events whose CmHandler's consumer
// has closed: run in the order they came, one thread at a time, inside a callback scope, freed
// after; a thread already delivering takes what is pushed meanwhile; dropped ones never run),
// and PostQpEvent's refusal of a registration that is not the event's.
#include "runtime/core/event_join.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/registry.h"

namespace cqd::internal {
namespace {

// Records the events it is given (by CmEvent::status), and whether each ran in a callback scope.
class Recording : public CmHandler {
 public:
  void OnCmEvent(const CmEvent& event) noexcept override {
    seen.push_back(event.status);
    in_callback.push_back(InCallbackScope());
    if (on_event) on_event(event);
  }
  std::vector<int> seen;
  std::vector<bool> in_callback;
  std::function<void(const CmEvent&)> on_event;
};

// A CM event of `watch` numbered `n`, holding `holds` holds and counted in the watch.
EventJoin* CmJoin(CmWatch& watch, int n, int holds = 1) {
  auto* join = new EventJoin;
  join->kind = EventJoin::Kind::kListener;
  join->watch = &watch;
  join->cm.status = n;
  join->holds.store(holds);
  watch.unfinished.fetch_add(1);
  return join;
}

TEST(EventJoin, OnlyDroppingTheLastPartSaysSo) {
  EventJoin join;
  join.parts.store(2);
  EXPECT_FALSE(join.DropPart());
  EXPECT_TRUE(join.DropPart());
  join.parts.store(1);
  EXPECT_TRUE(join.DropPart());
}

TEST(EventJoin, TheLastHoldFreesItAndItLeavesItsChannelsCountOnce) {
  CmWatch watch;
  EventJoin* join = CmJoin(watch, 1, /*holds=*/3);
  EventJoin::DropHold(join);
  EventJoin::DropHold(join);
  EXPECT_EQ(watch.unfinished.load(), 1) << "freed while a hold remained";
  EventJoin::DropHold(join);  // the last: freed, and counted as finished
  EXPECT_EQ(watch.unfinished.load(), 0);
  // Delivered first (Finish), then freed: counted once.
  join = CmJoin(watch, 2);
  join->Finish();
  EXPECT_EQ(watch.unfinished.load(), 0);
  join->Finish();
  EventJoin::DropHold(join);
  EXPECT_EQ(watch.unfinished.load(), 0);
  // A join of no channel (an async event, a LAST_WQE_REACHED stand-in) counts nowhere.
  EventJoin plain;
  plain.Finish();
}

// DropEventPart frees an async event or a LAST_WQE_REACHED stand-in with its last part.
TEST(EventJoin, DroppingTheLastPartOfAnAsyncEventFreesIt) {
  CmWatch watch;  // only to see the free: an async event is of no channel
  for (EventJoin::Kind kind : {EventJoin::Kind::kAsync, EventJoin::Kind::kLastWqeStandIn}) {
    auto* join = new EventJoin;
    join->kind = kind;
    join->watch = &watch;
    join->parts.store(2);
    watch.unfinished.store(1);
    DropEventPart(join);
    EXPECT_EQ(watch.unfinished.load(), 1) << "freed with a part left";
    DropEventPart(join);
    EXPECT_EQ(watch.unfinished.load(), 0);
  }
}

TEST(HeldEvents, RunInTheOrderTheyCameInACallbackScopeThenFreed) {
  Recording handler;
  CmWatch watch;
  watch.handler = &handler;
  HeldEvents held;
  held.DeliverAll();  // none held: nothing runs
  EXPECT_TRUE(handler.seen.empty());
  for (int n = 1; n <= 5; ++n) held.Push(CmJoin(watch, n));
  EXPECT_EQ(watch.unfinished.load(), 5);
  EXPECT_TRUE(handler.seen.empty()) << "pushing runs nothing";
  held.DeliverAll();
  EXPECT_EQ(handler.seen, (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(handler.in_callback, std::vector<bool>(5, true));
  EXPECT_FALSE(InCallbackScope()) << "the scope ends with each call";
  EXPECT_EQ(watch.unfinished.load(), 0) << "each delivered and freed";
  held.DeliverAll();  // all taken: nothing runs twice
  EXPECT_EQ(handler.seen.size(), 5u);
}

// A handler that hands on another event and delivers: the call returns at once (this thread is
// delivering already) and the outer loop runs the new one after the current, never nested.
TEST(HeldEvents, AThreadAlreadyDeliveringTakesWhatIsPushedMeanwhile) {
  Recording handler;
  CmWatch watch;
  watch.handler = &handler;
  HeldEvents held;
  int depth = 0, deepest = 0;
  handler.on_event = [&](const CmEvent& event) {
    deepest = std::max(deepest, ++depth);
    if (event.status == 1) {
      held.Push(CmJoin(watch, 3));
      held.DeliverAll();
    }
    --depth;
  };
  held.Push(CmJoin(watch, 1));
  held.Push(CmJoin(watch, 2));
  held.DeliverAll();
  EXPECT_EQ(handler.seen, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(deepest, 1) << "a handler ran inside another";
  EXPECT_EQ(watch.unfinished.load(), 0);
}

// Outside every dispatch batch, DeliverAllOrAfterBatch delivers at once.
TEST(HeldEvents, OutsideABatchTheyRunAtOnce) {
  Recording handler;
  CmWatch watch;
  watch.handler = &handler;
  HeldEvents held;
  held.Push(CmJoin(watch, 7));
  held.DeliverAllOrAfterBatch();
  EXPECT_EQ(handler.seen, std::vector<int>{7});
  EXPECT_EQ(watch.unfinished.load(), 0);
}

// One thread delivers at a time: while a handler holds the first thread, another thread's
// DeliverAll returns at once and what it pushed runs on the first thread, after.
TEST(HeldEvents, OneThreadDeliversAtATime) {
  Recording handler;
  CmWatch watch;
  watch.handler = &handler;
  HeldEvents held;
  std::atomic<bool> inside{false}, release{false};
  std::thread::id first_thread;
  std::vector<std::thread::id> ran_on;
  handler.on_event = [&](const CmEvent& event) {
    ran_on.push_back(std::this_thread::get_id());
    if (event.status != 1) return;
    inside.store(true);
    while (!release.load()) std::this_thread::yield();
  };
  held.Push(CmJoin(watch, 1));
  std::thread first([&] {
    first_thread = std::this_thread::get_id();
    held.DeliverAll();
  });
  while (!inside.load()) std::this_thread::yield();
  held.Push(CmJoin(watch, 2));
  held.DeliverAll();  // the first thread is delivering: returns without running anything
  const size_t ran_here = handler.seen.size();
  release.store(true);
  first.join();
  EXPECT_EQ(ran_here, 1u);
  EXPECT_EQ(handler.seen, (std::vector<int>{1, 2}));
  ASSERT_EQ(ran_on.size(), 2u);
  EXPECT_EQ(ran_on[1], first_thread);
  EXPECT_EQ(watch.unfinished.load(), 0);
}

TEST(HeldEvents, DroppedOnesNeverRunAndAreFreed) {
  Recording handler;
  CmWatch watch;
  watch.handler = &handler;
  HeldEvents held;
  for (int n = 1; n <= 3; ++n) held.Push(CmJoin(watch, n));
  held.DropAll();
  EXPECT_TRUE(handler.seen.empty());
  EXPECT_EQ(watch.unfinished.load(), 0);
  held.DeliverAll();
  EXPECT_TRUE(handler.seen.empty());
  held.Push(CmJoin(watch, 4));  // still usable afterwards
  held.DeliverAll();
  EXPECT_EQ(handler.seen, std::vector<int>{4});
}

// An event goes only to the live registration of its QP on its device: otherwise PostQpEvent
// posts nothing (it posts to no poller here, which it would need to) and says so.
TEST(PostQpEvent, RefusesARegistrationThatIsNotTheEvents) {
  SlotPool slots(8);
  const uint32_t index = static_cast<uint32_t>(slots.Allocate());
  Slot& slot = slots.slot(index);
  slot.qp_num.store(0x123);
  slot.device.store(2);
  AsyncEvent event;
  event.type = IBV_EVENT_COMM_EST;
  event.qp_num = 0x123;
  slot.state.store(MakeState(1, 0, /*live=*/false));
  EXPECT_FALSE(PostQpEvent(slots, {}, index, event, /*device=*/2, false)) << "not live";
  slot.state.store(MakeState(1, 0, /*live=*/true));
  EXPECT_FALSE(PostQpEvent(slots, {}, index, event, /*device=*/3, false)) << "another device";
  event.qp_num = 0x124;
  EXPECT_FALSE(PostQpEvent(slots, {}, index, event, /*device=*/2, true)) << "another QP";
  event.qp_num = 0x123;
  const uint32_t other_generation = 2;
  EXPECT_FALSE(PostQpEvent(slots, {}, index, event, 2, true, &other_generation))
      << "another generation (a stand-in for an earlier registration)";
}

}  // namespace
}  // namespace cqd::internal
