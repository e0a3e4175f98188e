// SPDX-License-Identifier: BSD-2-Clause
// The shard's stages (runtime/core/shard/), each driven on its own by the test as the shard's
// driver would: Spills (hand-over, back-pressure, the hold, the ask for room), CqSet (routing,
// orphans, round robin under a budget, a full consumer, arming, parking), the fused pass with a
// CQ list changed by a handler in the middle of a pass (the generic deferral), EventInbox (an
// event behind the completions before it) and HostedConsumers. The CQs are scripted
// (scripted_cq.h); the consumers are real, engine-driven or run to completion, and the test
// drains them.
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/consumer.h"
#include "runtime/core/event_join.h"
#include "runtime/core/fences.h"
#include "runtime/core/records.h"
#include "runtime/core/registry.h"
#include "runtime/core/shard/counters.h"
#include "runtime/core/shard/cq_set.h"
#include "runtime/core/shard/event_inbox.h"
#include "runtime/core/shard/fused_poll.h"
#include "runtime/core/shard/hosted.h"
#include "runtime/core/shard/router.h"
#include "runtime/core/shard/spills.h"
#include "tests/fixtures/fixtures.h"
#include "tests/unit/core/shard/scripted_cq.h"

namespace cqd::internal {
namespace {

using ::cqd::testing::OrphanLedger;
using ::cqd::testing::Recorder;

constexpr int kPollBatch = 8;
constexpr uint32_t kDevice = 1;

// One shard's stages over one consumer, put together as Shard does, with QPs registered on
// scripted CQs by hand. Members in the order they must be made (and unmade in reverse).
struct Stages {
  struct Config {
    ConsumerKind kind = ConsumerKind::kEngineDriven;
    size_t queue_capacity = 64;
    uint32_t spill_capacity = 64;
    bool hold = false;
    std::chrono::microseconds park_after{1000};
  };
  explicit Stages(const Config& config) {
    device.id = kDevice;
    options.poll_batch = kPollBatch;
    options.cq_park_after = config.park_after;
    ConsumerOptions c;
    c.kind = config.kind;
    c.name = "c";
    c.dispatch_batch = kPollBatch;
    c.queue_capacity = config.queue_capacity;
    c.spill_capacity = config.spill_capacity;
    options.consumers = {c};
    consumer = std::make_unique<Consumer>(0, options.consumers[0], slots, orphans, 1);
    const std::vector<Consumer*> consumers{consumer.get()};
    consumer->SetProducerParker(0, &parker);
    spills = std::make_unique<Spills>(0, consumers, kPollBatch, config.hold);
    router = std::make_unique<Router>(kPollBatch, false, fences, orphans, *spills);
    if (config.kind == ConsumerKind::kRunToCompletion) {
      consumer->RunOnPoller(&parker);
      spills->lane(0).direct = true;
      fused =
          std::make_unique<FusedPoll>(kPollBatch, counters, *spills, *router, orphans, WaitDuty{});
    }
    cqs = std::make_unique<CqSet>(options, counters, *spills, *router, fences, fused.get());
    inbox = std::make_unique<EventInbox>(counters, *spills, *cqs, parker);
    hosted = std::make_unique<HostedConsumers>(*spills, WaitDuty{});
    if (config.kind == ConsumerKind::kRunToCompletion) hosted->Add(consumer.get());
  }
  ~Stages() {
    inbox->Close();  // what is still held reaches the consumer, as at Stop
    consumer->CloseIfEmpty();
  }

  // A CQ of the shard (id `id`), scripted by `cq`.
  CqRecord& AddCq(ScriptedCq& cq, uint32_t id) {
    auto record = std::make_unique<CqRecord>();
    record->id = id;
    record->device = &device;
    record->cq = &cq;
    cqs->Add(record.get());
    records.push_back(std::move(record));
    return *records.back();
  }
  // Registers `qp_num` on `cq` (both its queues) to the consumer, delivering to `handler`.
  void Register(uint32_t qp_num, CqRecord& cq, QpHandler& handler) {
    const uint32_t index = static_cast<uint32_t>(slots.Allocate());
    Slot& slot = slots.slot(index);
    slot.handler.store(&handler);
    slot.qp_num.store(qp_num);
    slot.device.store(kDevice);
    slot.send_cq.store(cq.id);
    slot.recv_cq.store(cq.id);
    slot.state.store(MakeState(1, 0, /*live=*/true));
    device.qps.Set(qp_num, &slot);
    if (cq.uses.empty()) {
      cq.uses.push_back({0, 1});
    } else {
      ++cq.uses[0].count;
    }
    slot_of[qp_num] = index;
  }
  // Drains the engine-driven consumer until it holds nothing (bounded).
  void DrainAll() {
    for (int round = 0; round < 100 && consumer->Pending(); ++round) consumer->Drain(1024);
  }

  OrphanLedger ledger;
  RuntimeOptions options;
  SlotPool slots{16};
  OrphanSink orphans{&ledger};
  FenceList fences;
  DeviceRecord device;
  std::vector<std::unique_ptr<CqRecord>> records;
  std::map<uint32_t, uint32_t> slot_of;
  ShardCounters counters;
  Parker parker;
  std::unique_ptr<Consumer> consumer;
  std::unique_ptr<Spills> spills;
  std::unique_ptr<Router> router;
  std::unique_ptr<FusedPoll> fused;
  std::unique_ptr<CqSet> cqs;
  std::unique_ptr<EventInbox> inbox;
  std::unique_ptr<HostedConsumers> hosted;
};

// Appends completions `first`..`first + n - 1` of the consumer's only registration (slot 0).
void AppendRange(Stages& s, uint64_t first, int n) {
  for (int k = 0; k < n; ++k) {
    ibv_wc wc{};
    wc.wr_id = first + static_cast<uint64_t>(k);
    s.spills->AppendCompletion(0, {0, 1, EntryKind::kCompletion, 1, 0}, wc);
  }
}

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t k = 0; k < n; ++k) v.push_back(first + k);
  return v;
}

// ---- Spills ----

class SpillsTest : public ::testing::Test {
 protected:
  void SetUpStages(const Stages::Config& config) {
    s = std::make_unique<Stages>(config);
    cq = std::make_unique<ScriptedCq>();
    s->Register(0x11, s->AddCq(*cq, 1), handler);
  }
  Recorder handler;
  std::unique_ptr<ScriptedCq> cq;
  std::unique_ptr<Stages> s;
};

TEST_F(SpillsTest, AHandOverMovesWhatTheQueueHasRoomForAndKeepsTheRestInOrder) {
  SetUpStages({.queue_capacity = 4});
  AppendRange(*s, 0, 6);
  EXPECT_EQ(s->spills->Poll(), 1);
  EXPECT_EQ(s->spills->lane(0).spill_size(), 2u);  // the queue took 4
  s->DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 4));
  EXPECT_EQ(s->spills->Poll(), 1);
  EXPECT_TRUE(s->spills->empty());
  s->DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 6));
}

TEST_F(SpillsTest, AFullConsumerIsAskedForRoomAndTheAskIsTakenBackAfterTheSleep) {
  SetUpStages({.queue_capacity = 2});
  AppendRange(*s, 0, 4);
  s->spills->Poll();
  Lane& lane = s->spills->lane(0);
  EXPECT_TRUE(s->spills->TryEnterIdle());  // no room: nothing to do until the consumer frees some
  EXPECT_TRUE(lane.wants_room.load());
  s->spills->ExitIdle();
  EXPECT_FALSE(lane.wants_room.load());
  EXPECT_TRUE(s->spills->TryEnterIdle());
  s->DrainAll();  // frees room: the consumer takes the ask (and wakes the shard's parker)
  EXPECT_FALSE(lane.wants_room.load());
  EXPECT_FALSE(s->spills->TryEnterIdle());  // the room is there: it handed the rest over
  s->DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 4));
}

TEST_F(SpillsTest, TheHoldKeepsFullPollsAndAShortPollHandsEverythingOverAtOnce) {
  SetUpStages({.queue_capacity = 256, .hold = true});
  // A pass whose polls all came back full: held.
  s->spills->BeginHold();
  AppendRange(*s, 0, kPollBatch);
  s->spills->AfterPoll(kPollBatch);
  EXPECT_EQ(s->spills->EndHold(kPollBatch), 0);
  EXPECT_FALSE(s->consumer->Pending());
  EXPECT_EQ(s->spills->Poll(), 0);  // the spills stage leaves a held spill to the CQ stage
  // The next poll comes back short: the CQ is drained, so nothing more is waited for.
  s->spills->BeginHold();
  AppendRange(*s, kPollBatch, 3);
  s->spills->NoteShortPoll();
  s->spills->AfterPoll(3);
  EXPECT_TRUE(s->consumer->Pending());
  EXPECT_TRUE(s->spills->empty());
  s->spills->EndHold(3);
  s->DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, kPollBatch + 3));
}

TEST_F(SpillsTest, AnEngineDrivenShardNeverHolds) {
  SetUpStages({.queue_capacity = 256, .hold = false});
  s->spills->BeginHold();
  AppendRange(*s, 0, kPollBatch);
  s->spills->AfterPoll(kPollBatch);
  EXPECT_TRUE(s->consumer->Pending());
}

// ---- CqSet and Router ----

TEST(CqSetTest, ACqIsPolledIntoItsConsumersLaneAndAnUnknownQpsCompletionIsAnOrphan) {
  Stages s({});
  ScriptedCq cq;
  Recorder handler;
  handler.qp_num = 0x11;
  s.Register(0x11, s.AddCq(cq, 1), handler);
  cq.Push(0x11, 0);
  cq.Push(0x11, 1);
  cq.Push(0x99, 900);  // nobody's
  cq.Push(0x11, 2);
  EXPECT_GT(s.cqs->Poll(INT32_MAX), 0);
  EXPECT_EQ(cq.held(), 0u);
  s.DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 3));
  EXPECT_EQ(handler.wrong_qp(), 0u);
  EXPECT_EQ(s.ledger.wr_ids(), std::vector<uint64_t>{900});
  EXPECT_EQ(s.counters.completions.load(), 4u);
}

TEST(CqSetTest, APassCutShortByItsBudgetStartsTheNextPassAtTheCqItLeftOut) {
  Stages s({});
  ScriptedCq first, second;
  Recorder a, b;
  s.Register(0x11, s.AddCq(first, 1), a);
  s.Register(0x22, s.AddCq(second, 2), b);
  for (uint64_t k = 0; k < 10; ++k) first.Push(0x11, k);
  for (uint64_t k = 0; k < 5; ++k) second.Push(0x22, k);
  s.cqs->Poll(5);
  EXPECT_EQ(first.held(), 5u);
  EXPECT_EQ(second.polls, 0);  // the budget ran out before it
  s.cqs->Poll(5);
  EXPECT_EQ(second.held(), 0u);  // first in this pass
  EXPECT_EQ(first.held(), 5u);
  s.DrainAll();
  EXPECT_EQ(a.wr_ids(), Range(0, 5));
  EXPECT_EQ(b.wr_ids(), Range(0, 5));
}

TEST(CqSetTest, AFullConsumersCompletionsWaitInTheCqAndNoneIsLost) {
  Stages s({.queue_capacity = 2, .spill_capacity = 2});
  ScriptedCq cq;
  Recorder handler;
  s.Register(0x11, s.AddCq(cq, 1), handler);
  for (uint64_t k = 0; k < 10; ++k) cq.Push(0x11, k);
  for (int pass = 0; pass < 5; ++pass) s.cqs->Poll(INT32_MAX);
  EXPECT_EQ(cq.held(), 6u);  // 2 handed over, 2 in the spill: the CQ is skipped
  EXPECT_GT(s.counters.backpressure_stalls.load(), 0u);
  for (int round = 0; round < 20 && (cq.held() > 0 || s.consumer->Pending()); ++round) {
    s.DrainAll();
    s.spills->Poll();
    s.cqs->Poll(INT32_MAX);
  }
  s.DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 10));
  EXPECT_EQ(s.ledger.count.load(), 0u);
}

TEST(CqSetTest, TheSleepArmsEachCqOnceLooksAgainAndAFailedArmBoundsIt) {
  Stages s({});
  ScriptedCq cq, failing;
  Recorder a, b;
  CqRecord& record = s.AddCq(cq, 1);
  s.Register(0x11, record, a);
  EXPECT_TRUE(s.cqs->TryEnterIdle());
  EXPECT_EQ(cq.arms, 1);
  EXPECT_TRUE(record.armed.load());
  EXPECT_TRUE(s.cqs->TryEnterIdle());
  EXPECT_EQ(cq.arms, 1);  // still armed: no event came since (S7)
  cq.Push(0x11, 0);       // came before the event could: the re-check's poll finds it (S6)
  EXPECT_FALSE(s.cqs->TryEnterIdle());
  EXPECT_FALSE(s.cqs->MustBoundSleep());
  failing.fail_arm = true;
  s.Register(0x22, s.AddCq(failing, 2), b);
  s.cqs->TryEnterIdle();
  EXPECT_TRUE(s.cqs->MustBoundSleep());  // no event may come for it
  s.DrainAll();
  EXPECT_EQ(a.wr_ids(), Range(0, 1));
}

TEST(CqSetTest, ACqAFullConsumerHoldsBackSleepsUnarmedAndTheFreedRoomWakesTheShard) {
  Stages s({.queue_capacity = 2, .spill_capacity = 2});
  ScriptedCq cq;
  Recorder handler;
  CqRecord& record = s.AddCq(cq, 1);
  s.Register(0x11, record, handler);
  for (uint64_t k = 0; k < 10; ++k) cq.Push(0x11, k);
  for (int pass = 0; pass < 3; ++pass) s.cqs->Poll(INT32_MAX);
  ASSERT_EQ(cq.held(), 6u);  // 2 handed over, 2 in the spill
  // The sleep, as Shard::ArmAndRecheck makes it: the spills ask for room, the CQ stays unarmed
  // (an event from it would only wake the shard to skip it again).
  const uint32_t ticket = s.parker.Prepare();
  ASSERT_TRUE(s.spills->TryEnterIdle());
  EXPECT_TRUE(s.cqs->TryEnterIdle());
  EXPECT_EQ(cq.arms, 0);
  EXPECT_FALSE(record.armed.load());
  // The consumer frees room: it wakes the shard (the sleeper's cancel fails: a waker took it),
  // so the CQ's completions are polled with no event.
  s.DrainAll();
  EXPECT_FALSE(s.parker.TryCancel());
  s.parker.Park(ticket);  // returns at once: woken
  s.spills->ExitIdle();
  for (int round = 0; round < 20 && (cq.held() > 0 || !s.spills->empty() || s.consumer->Pending());
       ++round) {
    s.spills->Poll();
    s.cqs->Poll(INT32_MAX);
    s.DrainAll();
  }
  EXPECT_EQ(handler.wr_ids(), Range(0, 10));
  // Nothing held back any more: the next sleep arms the CQ.
  s.parker.Prepare();
  ASSERT_TRUE(s.spills->TryEnterIdle());
  EXPECT_TRUE(s.cqs->TryEnterIdle());
  EXPECT_EQ(cq.arms, 1);
  EXPECT_TRUE(record.armed.load());
  s.parker.Cancel();
}

TEST(CqSetTest, AnIdleCqIsParkedAndItsEventBringsItBack) {
  Stages s({.park_after = std::chrono::microseconds(1)});
  ScriptedCq cq;
  Recorder handler;
  CqRecord& record = s.AddCq(cq, 1);
  s.Register(0x11, record, handler);
  for (int pass = 0; pass < 1000 && s.counters.parked_cqs.load() == 0; ++pass) {
    s.cqs->Poll(INT32_MAX);
  }
  ASSERT_EQ(s.counters.parked_cqs.load(), 1u);
  EXPECT_TRUE(record.armed.load());  // armed before it parked
  const int polls = cq.polls;
  cq.Push(0x11, 7);
  s.cqs->Poll(INT32_MAX);
  EXPECT_EQ(cq.polls, polls);  // parked: out of the passes
  EXPECT_EQ(cq.held(), 1u);
  record.armed.store(false);  // the event thread, on the CQ's event
  s.cqs->NoteCqEvents();
  s.cqs->Poll(INT32_MAX);
  EXPECT_EQ(cq.held(), 0u);
  EXPECT_EQ(s.counters.parked_cqs.load(), 0u);
  s.DrainAll();
  EXPECT_EQ(handler.wr_ids(), std::vector<uint64_t>{7});
}

// ---- The fused pass and the deferral of a list change mid-pass ----

TEST(FusedPassTest, AHandlerThatRemovesCqsMidPassLeavesThePassSafeAndTheListCompact) {
  Stages s({.kind = ConsumerKind::kRunToCompletion});
  ScriptedCq first, second;
  Recorder a, b;
  CqRecord& one = s.AddCq(first, 1);
  CqRecord& two = s.AddCq(second, 2);
  s.Register(0x11, one, a);
  s.Register(0x22, two, b);
  for (uint64_t k = 0; k < 3; ++k) first.Push(0x11, k);
  for (uint64_t k = 0; k < 3; ++k) second.Push(0x22, 100 + k);
  // In its first call, inside the pass, a's handler removes both CQs: the one being polled and
  // the one the pass has not reached. A removal polls the CQ out to the orphan sink.
  bool removed = false;
  a.before = [&](std::span<const ibv_wc>) {
    if (removed) return;
    removed = true;
    s.fused->Settle();  // as Shard::RunSync does before a control part on this thread
    s.cqs->Remove(&two);
    s.cqs->Remove(&one);
  };
  s.cqs->Poll(INT32_MAX);
  EXPECT_TRUE(removed);
  EXPECT_EQ(a.wr_ids(), Range(0, 3));  // the fused run, in the handler's one call
  EXPECT_EQ(a.calls(), 1u);
  EXPECT_EQ(b.received(), 0u);  // the pass never reached it: the removal polled it out
  EXPECT_EQ(s.ledger.wr_ids(), (std::vector<uint64_t>{100, 101, 102}));
  EXPECT_EQ(s.cqs->Find(1), nullptr);
  EXPECT_EQ(s.cqs->Find(2), nullptr);
  // Neither is polled again.
  const int first_polls = first.polls;
  const int second_polls = second.polls;
  first.Push(0x11, 3);
  second.Push(0x22, 103);
  s.cqs->Poll(INT32_MAX);
  EXPECT_TRUE(s.cqs->TryEnterIdle());
  EXPECT_EQ(first.polls, first_polls);
  EXPECT_EQ(second.polls, second_polls);
  EXPECT_EQ(first.held(), 1u);
  EXPECT_EQ(second.held(), 1u);
}

TEST(FusedPassTest, ARemovalOfACqThePassHasPolledAlreadyKeepsEveryOtherCqInThePass) {
  Stages s({.kind = ConsumerKind::kRunToCompletion});
  ScriptedCq first, second, third;
  Recorder a, b, c;
  CqRecord& one = s.AddCq(first, 1);
  s.Register(0x11, one, a);
  s.Register(0x22, s.AddCq(second, 2), b);
  s.Register(0x33, s.AddCq(third, 3), c);
  second.Push(0x22, 0);
  third.Push(0x33, 0);
  // b's handler, inside the pass, removes the CQ the pass polled before its own.
  b.before = [&](std::span<const ibv_wc>) {
    if (s.cqs->Find(1) == nullptr) return;
    s.fused->Settle();
    s.cqs->Remove(&one);
  };
  s.cqs->Poll(INT32_MAX);
  EXPECT_EQ(b.wr_ids(), std::vector<uint64_t>{0});
  EXPECT_EQ(c.wr_ids(), std::vector<uint64_t>{0});  // the pass went on past the removal
  EXPECT_EQ(s.cqs->Find(1), nullptr);
  ASSERT_NE(s.cqs->Find(2), nullptr);
  ASSERT_NE(s.cqs->Find(3), nullptr);
  third.Push(0x33, 1);
  second.Push(0x22, 1);
  s.cqs->Poll(INT32_MAX);
  EXPECT_EQ(b.wr_ids(), Range(0, 2));
  EXPECT_EQ(c.wr_ids(), Range(0, 2));
}

TEST(FusedPassTest, ACqAddedByAHandlerMidPassIsPolledFromThenOn) {
  Stages s({.kind = ConsumerKind::kRunToCompletion});
  ScriptedCq first, second;
  Recorder a, b;
  CqRecord& one = s.AddCq(first, 1);
  s.Register(0x11, one, a);
  first.Push(0x11, 0);
  ScriptedCq* added = &second;
  a.before = [&](std::span<const ibv_wc>) {
    if (added == nullptr) return;
    s.fused->Settle();
    s.Register(0x22, s.AddCq(*added, 2), b);
    added = nullptr;
  };
  second.Push(0x22, 5);
  for (int pass = 0; pass < 3; ++pass) {
    s.cqs->Poll(INT32_MAX);
    s.hosted->Poll();
  }
  EXPECT_EQ(a.wr_ids(), Range(0, 1));
  EXPECT_EQ(b.wr_ids(), std::vector<uint64_t>{5});
}

// ---- EventInbox and HostedConsumers ----

TEST(EventInboxTest, AnEventIsPlacedBehindEveryCompletionThatWasInItsCqBeforeIt) {
  Stages s({});
  ScriptedCq cq;
  Recorder handler;
  CqRecord& record = s.AddCq(cq, 1);
  s.Register(0x11, record, handler);
  for (uint64_t k = 0; k < 3; ++k) cq.Push(0x11, k);  // not polled yet when the event comes
  auto* join = new EventJoin;
  join->kind = EventJoin::Kind::kAsync;
  join->event.type = IBV_EVENT_QP_FATAL;
  join->parts.store(1);
  Item item;
  item.join = join;
  item.kind = EntryKind::kEventPart;
  item.slot = s.slot_of[0x11];
  item.generation = 1;
  ASSERT_TRUE(s.inbox->Post(0, item, record.id, 0));
  EXPECT_EQ(s.inbox->Poll(), 1);  // caught up on the CQ, then placed
  EXPECT_EQ(cq.held(), 0u);
  s.spills->Flush(false);
  s.DrainAll();
  const std::vector<Recorder::Entry> log = handler.log();
  ASSERT_EQ(log.size(), 4u);
  for (int k = 0; k < 3; ++k) EXPECT_FALSE(log[k].event) << k;
  EXPECT_TRUE(log[3].event);
  EXPECT_EQ(log[3].type, IBV_EVENT_QP_FATAL);
}

TEST(EventInboxTest, AnEventHeldBackByAFullLaneAsksForRoomAndWaitsInOrder) {
  Stages s({.queue_capacity = 1, .spill_capacity = 1});
  ScriptedCq cq;
  Recorder handler;
  CqRecord& record = s.AddCq(cq, 1);
  s.Register(0x11, record, handler);
  AppendRange(s, 0, 1);
  s.spills->Poll();
  AppendRange(s, 1, 1);  // the queue and the spill are full
  auto* join = new EventJoin;
  join->kind = EventJoin::Kind::kAsync;
  join->event.type = IBV_EVENT_QP_FATAL;
  join->parts.store(1);
  Item item;
  item.join = join;
  item.kind = EntryKind::kEventPart;
  item.slot = s.slot_of[0x11];
  item.generation = 1;
  ASSERT_TRUE(s.inbox->Post(0, item, 0, 0));
  EXPECT_EQ(s.inbox->Poll(), 0);
  EXPECT_TRUE(s.inbox->TryEnterIdle());
  EXPECT_TRUE(s.spills->lane(0).wants_room.load());
  for (int round = 0; round < 10 && handler.events() == 0; ++round) {
    s.DrainAll();
    s.inbox->Poll();
    s.spills->Poll();
  }
  s.DrainAll();
  EXPECT_EQ(handler.wr_ids(), Range(0, 2));
  EXPECT_EQ(handler.events(), 1u);
  EXPECT_TRUE(handler.log().back().event);
}

TEST(HostedConsumersTest, ARunToCompletionConsumerRunsFromTheSpillInOrderAndThenCloses) {
  Stages s({.kind = ConsumerKind::kRunToCompletion});
  ScriptedCq cq;
  Recorder handler;
  s.Register(0x11, s.AddCq(cq, 1), handler);
  AppendRange(s, 0, 20);  // more than one batch
  EXPECT_TRUE(s.hosted->Pending());
  EXPECT_FALSE(s.hosted->TryEnterIdle());
  EXPECT_EQ(s.hosted->Poll(), 20);
  EXPECT_FALSE(s.consumer->Pending());  // nothing was handed over: run from the spill
  EXPECT_EQ(handler.wr_ids(), Range(0, 20));
  EXPECT_TRUE(s.hosted->TryEnterIdle());
  AppendRange(s, 20, 2);
  s.hosted->Close();
  EXPECT_EQ(handler.wr_ids(), Range(0, 22));
}

}  // namespace
}  // namespace cqd::internal
