// SPDX-License-Identifier: BSD-2-Clause
// Route (runtime/core/route.h): the one decision over what becomes of an entry or an event.
// Four parts:
//   - the table, case by case and stage by stage, each case named as the README and DESIGN name it;
//   - the whole space of facts, walked, against the guarantees (no retired QP's completion
//     reaches a handler, no marker reaches a handler or the OrphanHandler, nothing is run when
//     no consumer is left);
//   - polls through a real FenceList: a retired QP's leftovers before and after its markers,
//     the markers in either order, another CQ, another qp_num;
//   - the readers of a registration each stage gathers its facts with (RouteAtConsumer,
//     RouteQpEvent, RouteDeviceEvent), over real slots.
#include "runtime/core/route.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/core/fake_cq.h"

namespace cqd::internal {
namespace {

using Taken = FenceList::Taken;
using Stage = RouteStage;

// The facts of a live registration polled from a CQ its QP uses.
constexpr RouteFacts LiveAtPoll() { return {.known = true, .live = true, .uses_cq = true}; }

struct Case {
  const char* name;
  Stage stage;
  RouteFacts facts;
  Disposal want;
};

RouteFacts With(RouteFacts f, auto change) {
  change(f);
  return f;
}

const std::vector<Case>& Table() {
  static const std::vector<Case> table = {
      // At the poll.
      {"live", Stage::kPoll, LiveAtPoll(), Disposal::kDeliver},
      {"unknown qp_num", Stage::kPoll, {}, Disposal::kOrphan},
      {"dead registration", Stage::kPoll, With(LiveAtPoll(), [](auto& f) { f.live = false; }),
       Disposal::kOrphan},
      {"number held by another registration or device", Stage::kPoll,
       With(LiveAtPoll(), [](auto& f) { f.known = false; }), Disposal::kOrphan},
      {"wrong CQ", Stage::kPoll, With(LiveAtPoll(), [](auto& f) { f.uses_cq = false; }),
       Disposal::kOrphan},
      {"draining, an ordinary completion", Stage::kPoll,
       With(LiveAtPoll(), [](auto& f) { f.tearing_down = true; }), Disposal::kDeliver},
      {"draining, its own marker", Stage::kPoll,
       With(LiveAtPoll(),
            [](auto& f) {
              f.tearing_down = true;
              f.is_marker = true;
            }),
       Disposal::kNoteMarker},
      {"a marker's wr_id from a QP that is not draining", Stage::kPoll,
       With(LiveAtPoll(), [](auto& f) { f.is_marker = true; }), Disposal::kDeliver},
      {"retired QP's awaited marker", Stage::kPoll,
       With(LiveAtPoll(), [](auto& f) { f.fence = Taken::kMarker; }), Disposal::kFenceTaken},
      {"leftover before its marker, number live again", Stage::kPoll,
       With(LiveAtPoll(), [](auto& f) { f.fence = Taken::kBehindMarker; }), Disposal::kOrphan},
      {"leftover before its marker, number unknown",
       Stage::kPoll,
       {.fence = Taken::kBehindMarker},
       Disposal::kOrphan},
      {"awaited marker, number unknown (CQ being removed)",
       Stage::kPoll,
       {.fence = Taken::kMarker},
       Disposal::kFenceTaken},
      // At the consumer.
      {"completion, still live",
       Stage::kConsumer,
       {.kind = EntryKind::kCompletion, .live = true},
       Disposal::kDeliver},
      {"completion, unregistered since the poll",
       Stage::kConsumer,
       {.kind = EntryKind::kCompletion},
       Disposal::kOrphan},
      {"marker, teardown still on",
       Stage::kConsumer,
       {.kind = EntryKind::kTeardownMarker, .live = true},
       Disposal::kNoteMarker},
      {"marker, teardown over",
       Stage::kConsumer,
       {.kind = EntryKind::kTeardownMarker},
       Disposal::kDropMarker},
      {"event part, live",
       Stage::kConsumer,
       {.kind = EntryKind::kEventPart, .live = true},
       Disposal::kDeliver},
      {"event part, unregistered",
       Stage::kConsumer,
       {.kind = EntryKind::kEventPart},
       Disposal::kDropEvent},
      {"listener event (nobody's registration)",
       Stage::kConsumer,
       {.kind = EntryKind::kListenerEvent},
       Disposal::kDeliver},
      // No consumer left.
      {"completion, no consumer",
       Stage::kNoConsumer,
       {.kind = EntryKind::kCompletion, .live = true},
       Disposal::kOrphan},
      {"marker, no consumer",
       Stage::kNoConsumer,
       {.kind = EntryKind::kTeardownMarker, .live = true},
       Disposal::kDropMarker},
      {"event part, no consumer",
       Stage::kNoConsumer,
       {.kind = EntryKind::kEventPart, .live = true},
       Disposal::kDropEvent},
      {"listener event, no consumer",
       Stage::kNoConsumer,
       {.kind = EntryKind::kListenerEvent},
       Disposal::kDropEvent},
      // A QP's async event, on the event thread (a CM id's bind too).
      {"QP event, live registration",
       Stage::kQpEvent,
       {.known = true, .live = true},
       Disposal::kDeliver},
      {"QP event, unregistered", Stage::kQpEvent, {.known = true}, Disposal::kToFallback},
      {"QP event, number unknown on the device",
       Stage::kQpEvent,
       {.live = true},
       Disposal::kToFallback},
      // A device's event, fanned out registration by registration.
      {"device event, live on the device, using the CQ",
       Stage::kDeviceEvent,
       {.known = true, .live = true, .uses_cq = true},
       Disposal::kDeliver},
      {"device event, another CQ",
       Stage::kDeviceEvent,
       {.known = true, .live = true},
       Disposal::kUnaffected},
      {"device event, another device",
       Stage::kDeviceEvent,
       {.live = true, .uses_cq = true},
       Disposal::kUnaffected},
      {"device event, a dead registration",
       Stage::kDeviceEvent,
       {.known = true, .uses_cq = true},
       Disposal::kUnaffected},
  };
  return table;
}

TEST(RouteTest, EveryCaseOfTheTable) {
  for (const Case& c : Table()) {
    EXPECT_EQ(Route(c.stage, c.facts), c.want) << c.name;
  }
}

// Every combination of facts a caller can gather.
template <typename F>
void ForEveryFact(F visit) {
  const EntryKind kinds[] = {EntryKind::kCompletion, EntryKind::kEventPart,
                             EntryKind::kTeardownMarker, EntryKind::kListenerEvent};
  const Taken fences[] = {Taken::kNotFenced, Taken::kMarker, Taken::kBehindMarker};
  for (Stage stage :
       {Stage::kPoll, Stage::kConsumer, Stage::kNoConsumer, Stage::kQpEvent, Stage::kDeviceEvent}) {
    for (EntryKind kind : kinds) {
      for (Taken fence : fences) {
        for (int bits = 0; bits < 32; ++bits) {
          RouteFacts f{.kind = kind,
                       .fence = fence,
                       .known = (bits & 1) != 0,
                       .live = (bits & 2) != 0,
                       .uses_cq = (bits & 4) != 0,
                       .tearing_down = (bits & 8) != 0,
                       .is_marker = (bits & 16) != 0};
          visit(stage, f);
        }
      }
    }
  }
}

TEST(RouteTest, TheGuaranteesHoldOverTheWholeSpaceOfFacts) {
  int walked = 0;
  ForEveryFact([&](Stage stage, const RouteFacts& f) {
    ++walked;
    const Disposal d = Route(stage, f);
    const std::string at = "stage " + std::to_string(static_cast<int>(stage)) + " kind " +
                           std::to_string(static_cast<int>(f.kind)) + " fence " +
                           std::to_string(static_cast<int>(f.fence));
    if (stage == Stage::kPoll) {
      // Only a live registration's own completion, from a CQ it uses, reaches a consumer, and
      // nothing a fence claims does.
      if (Runs(d)) {
        EXPECT_TRUE(f.fence == Taken::kNotFenced && f.known && f.live && f.uses_cq) << at;
      }
      EXPECT_EQ(d == Disposal::kFenceTaken, f.fence == Taken::kMarker) << at;
      EXPECT_EQ(d == Disposal::kNoteMarker, Runs(d) && f.tearing_down && f.is_marker) << at;
      EXPECT_NE(d, Disposal::kDropEvent) << at;  // a poll takes completions only
      EXPECT_NE(d, Disposal::kDropMarker) << at;
      EXPECT_NE(d, Disposal::kToFallback) << at;
      EXPECT_NE(d, Disposal::kUnaffected) << at;
      return;
    }
    if (stage == Stage::kQpEvent) {
      // To the registration only if it is live and holds the number; else the device's handler.
      EXPECT_EQ(d, f.known && f.live ? Disposal::kDeliver : Disposal::kToFallback) << at;
      return;
    }
    if (stage == Stage::kDeviceEvent) {
      // Only a live registration on the device that the event takes down gets its copy.
      EXPECT_EQ(d, f.known && f.live && f.uses_cq ? Disposal::kDeliver : Disposal::kUnaffected)
          << at;
      return;
    }
    EXPECT_NE(d, Disposal::kToFallback) << at;  // an entry always has a consumer's disposal
    EXPECT_NE(d, Disposal::kUnaffected) << at;
    // After the poll: only the kind and the registration's liveness count.
    RouteFacts bare{.kind = f.kind, .live = f.live};
    EXPECT_EQ(d, Route(stage, bare)) << at;
    EXPECT_NE(d, Disposal::kFenceTaken) << at;
    if (stage == Stage::kNoConsumer) {
      EXPECT_FALSE(Runs(d)) << at;
    }
    switch (f.kind) {
      case EntryKind::kCompletion:  // a handler or the OrphanHandler, by liveness
        EXPECT_EQ(d, stage == Stage::kConsumer && f.live ? Disposal::kDeliver : Disposal::kOrphan)
            << at;
        break;
      case EntryKind::kTeardownMarker:  // the runtime's own: never a handler, never an orphan
        EXPECT_TRUE(d == Disposal::kNoteMarker || d == Disposal::kDropMarker) << at;
        EXPECT_EQ(d == Disposal::kNoteMarker, stage == Stage::kConsumer && f.live) << at;
        break;
      case EntryKind::kEventPart:
        EXPECT_EQ(d,
                  stage == Stage::kConsumer && f.live ? Disposal::kDeliver : Disposal::kDropEvent)
            << at;
        break;
      case EntryKind::kListenerEvent:
        EXPECT_EQ(d, stage == Stage::kConsumer ? Disposal::kDeliver : Disposal::kDropEvent) << at;
        break;
    }
  });
  EXPECT_EQ(walked, 5 * 4 * 3 * 32);
}

// Polls through a real FenceList, as Poller::Classify does: the CQ's fences first, then the
// registration's facts.
class RouteThroughFencesTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kQp = 0x101;
  static constexpr uint32_t kOtherQp = 0x202;
  static constexpr uint64_t kSendMarker = 0x7f0000001000;
  static constexpr uint64_t kRecvMarker = kSendMarker + 1;

  RouteThroughFencesTest() {
    cq.cq = &fake;
    other.cq = &other_fake;
  }
  // Retires kQp on `on`: both its markers awaited there (send and receive on one CQ).
  void Retire(CqRecord& on) {
    fences.Add({.cq = &on, .qp_num = kQp, .marker = kSendMarker, .commit = 4}, false);
    fences.Add({.cq = &on, .qp_num = kQp, .marker = kRecvMarker, .commit = 4}, false);
  }
  // What a poll of `from` does with a completion of `qp_num`, whose registration has `facts`.
  Disposal Poll(CqRecord& from, uint32_t qp_num, uint64_t wr_id, RouteFacts facts) {
    ibv_wc wc{};
    wc.qp_num = qp_num;
    wc.wr_id = wr_id;
    if (from.fenced.awaited_markers != 0) facts.fence = fences.Take(&from, wc);
    return Route(Stage::kPoll, facts);
  }

  FakeCq fake{64};
  FakeCq other_fake{64};
  CqRecord cq;
  CqRecord other;
  FenceList fences;
  const RouteFacts successor = LiveAtPoll();  // a new QP with kQp, live on the CQ
  const RouteFacts gone{};                    // nobody holds the number
};

TEST_F(RouteThroughFencesTest, LeftoversBeforeAndAfterTheMarkersSendFirst) {
  Retire(cq);
  EXPECT_EQ(Poll(cq, kQp, 1, successor), Disposal::kOrphan);  // flushed before the markers
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, successor), Disposal::kFenceTaken);
  EXPECT_EQ(Poll(cq, kQp, 2, successor), Disposal::kOrphan);  // the receive side's, still fenced
  EXPECT_EQ(Poll(cq, kQp, kRecvMarker, successor), Disposal::kFenceTaken);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(Poll(cq, kQp, 3, successor), Disposal::kDeliver);  // after both: the successor's
  EXPECT_EQ(Poll(cq, kQp, 4, gone), Disposal::kOrphan);
}

TEST_F(RouteThroughFencesTest, LeftoversBeforeAndAfterTheMarkersReceiveFirst) {
  Retire(cq);
  EXPECT_EQ(Poll(cq, kQp, 1, successor), Disposal::kOrphan);
  EXPECT_EQ(Poll(cq, kQp, kRecvMarker, successor), Disposal::kFenceTaken);
  EXPECT_EQ(Poll(cq, kQp, 2, successor), Disposal::kOrphan);
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, successor), Disposal::kFenceTaken);
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(Poll(cq, kQp, 3, successor), Disposal::kDeliver);
}

TEST_F(RouteThroughFencesTest, AMarkerTakenTwiceIsTheSecondTimeAnOrdinaryCompletion) {
  Retire(cq);
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, gone), Disposal::kFenceTaken);
  EXPECT_EQ(Poll(cq, kQp, kRecvMarker, gone), Disposal::kFenceTaken);
  // The fence is over: a wr_id equal to the old marker routes by the registration's facts.
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, successor), Disposal::kDeliver);
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, gone), Disposal::kOrphan);
}

TEST_F(RouteThroughFencesTest, AnotherQpNumberOrAnotherCqRoutesByItsRegistration) {
  Retire(cq);
  EXPECT_EQ(Poll(cq, kOtherQp, 1, successor), Disposal::kDeliver);
  EXPECT_EQ(Poll(cq, kOtherQp, 2, gone), Disposal::kOrphan);
  EXPECT_EQ(Poll(other, kQp, 3, successor), Disposal::kDeliver);  // no fence on `other`
  RouteFacts elsewhere = successor;
  elsewhere.uses_cq = false;  // the successor's QP does not use `other`
  EXPECT_EQ(Poll(other, kQp, 4, elsewhere), Disposal::kOrphan);
}

TEST_F(RouteThroughFencesTest, AnUnfencedSideKeepsTheNumberFromASuccessorUntilACatchUp) {
  fences.Add({.cq = &cq, .qp_num = kQp, .marker = kSendMarker, .commit = 4}, false);
  fences.Add({.cq = &cq, .qp_num = kQp, .unfenced = true, .commit = 4}, false);
  EXPECT_EQ(Poll(cq, kQp, kSendMarker, gone), Disposal::kFenceTaken);
  // No marker stands behind the receive side: its completions route by the registration, and
  // while the fence stands nobody may register the number there (Poller::FenceForReuse).
  EXPECT_EQ(Poll(cq, kQp, 1, gone), Disposal::kOrphan);
  EXPECT_TRUE(fences.Holds(&cq, kQp));
  fences.StartCatchUps(&cq, kQp);
  fences.Polled(&cq, 0, /*empty=*/true);
  EXPECT_FALSE(fences.Holds(&cq, kQp));
  EXPECT_EQ(cq.leftover_commit.load(), 0u);
  EXPECT_EQ(Poll(cq, kQp, 2, successor), Disposal::kDeliver);
}

// The readers: each stage's one read of a registration, over real slots.
class RouteReadersTest : public ::testing::Test {
 protected:
  RouteReadersTest() : index(static_cast<uint32_t>(slots.Allocate())), slot(slots.slot(index)) {
    slot.qp_num.store(0x123);
    slot.device.store(2);
    slot.send_shard.store(1);
    slot.recv_shard.store(3);
    slot.send_cq.store(11);
    slot.recv_cq.store(12);
    slot.state.store(MakeState(/*generation=*/9, /*consumer=*/5, /*live=*/true));
  }
  SlotPool slots{8};
  const uint32_t index;
  Slot& slot;
};

TEST_F(RouteReadersTest, AQpEventGoesAlongTheRouteItsStateNames) {
  const QpEventTarget target = RouteQpEvent(slot, index, 2, 0x123);
  ASSERT_EQ(target.disposal, Disposal::kDeliver);
  EXPECT_FALSE(target.tearing_down);
  EXPECT_EQ(target.route.slot, index);
  EXPECT_EQ(target.route.generation, 9u);
  EXPECT_EQ(target.route.consumer, 5u);
  EXPECT_EQ(target.route.send_shard, 1);
  EXPECT_EQ(target.route.recv_shard, 3);
  EXPECT_EQ(target.route.send_cq, 11u);
  EXPECT_EQ(target.route.recv_cq, 12u);
  slot.state.store(MakeState(9, 5, true, /*tearing_down=*/true));
  EXPECT_TRUE(RouteQpEvent(slot, index, 2, 0x123).tearing_down);
}

TEST_F(RouteReadersTest, AQpEventNotOfTheLiveRegistrationGoesToTheFallback) {
  EXPECT_EQ(RouteQpEvent(slot, index, 3, 0x123).disposal, Disposal::kToFallback) << "device";
  EXPECT_EQ(RouteQpEvent(slot, index, 2, 0x124).disposal, Disposal::kToFallback) << "QP";
  const uint32_t earlier = 8;
  EXPECT_EQ(RouteQpEvent(slot, index, 2, 0x123, &earlier).disposal, Disposal::kToFallback);
  const uint32_t bound = 9;
  EXPECT_EQ(RouteQpEvent(slot, index, 2, 0x123, &bound).disposal, Disposal::kDeliver);
  slot.state.store(MakeState(10, 5, /*live=*/false));
  EXPECT_EQ(RouteQpEvent(slot, index, 2, 0x123).disposal, Disposal::kToFallback) << "dead";
}

TEST_F(RouteReadersTest, ADeviceEventTakesDownTheRegistrationsItNames) {
  EXPECT_EQ(RouteDeviceEvent(slot, 2, /*fatal=*/true, 0), Disposal::kDeliver);
  EXPECT_EQ(RouteDeviceEvent(slot, 2, false, 11), Disposal::kDeliver) << "its send CQ";
  EXPECT_EQ(RouteDeviceEvent(slot, 2, false, 12), Disposal::kDeliver) << "its receive CQ";
  EXPECT_EQ(RouteDeviceEvent(slot, 2, false, 13), Disposal::kUnaffected) << "another CQ";
  EXPECT_EQ(RouteDeviceEvent(slot, 2, false, 0), Disposal::kUnaffected) << "an unknown CQ";
  EXPECT_EQ(RouteDeviceEvent(slot, 3, true, 0), Disposal::kUnaffected) << "another device";
  slot.state.store(MakeState(10, 5, /*live=*/false));
  EXPECT_EQ(RouteDeviceEvent(slot, 2, true, 0), Disposal::kUnaffected) << "dead";
}

TEST_F(RouteReadersTest, AtTheConsumerTheEntrysGenerationMustStillBeLive) {
  bool tearing_down = true;
  EXPECT_EQ(RouteAtConsumer(EntryKind::kCompletion, slot, 9, &tearing_down), Disposal::kDeliver);
  EXPECT_FALSE(tearing_down);
  EXPECT_EQ(RouteAtConsumer(EntryKind::kCompletion, slot, 8), Disposal::kOrphan);
  EXPECT_EQ(RouteAtConsumer(EntryKind::kEventPart, slot, 8), Disposal::kDropEvent);
  EXPECT_EQ(RouteAtConsumer(EntryKind::kListenerEvent, slot, 8), Disposal::kDeliver);
  slot.state.store(MakeState(9, 5, true, /*tearing_down=*/true));
  EXPECT_EQ(RouteAtConsumer(EntryKind::kTeardownMarker, slot, 9, &tearing_down),
            Disposal::kNoteMarker);
  EXPECT_TRUE(tearing_down);
  slot.state.store(MakeState(10, 5, /*live=*/false));
  EXPECT_EQ(RouteAtConsumer(EntryKind::kTeardownMarker, slot, 9), Disposal::kDropMarker);
}

// By slot index, as a purge of the spills routes: a listener's event names no slot (kNoSlot) and
// the pool is not read for it (SlotPool::slot checks its index in debug builds).
TEST(RouteEntryAtConsumerTest, AListenerEventReadsNoSlot) {
  SlotPool pool(16);
  const int64_t index = pool.Allocate();
  ASSERT_GE(index, 0);
  Slot& slot = pool.slot(static_cast<uint32_t>(index));
  slot.state.store(MakeState(3, 0, /*live=*/true));
  EXPECT_EQ(RouteEntryAtConsumer(EntryKind::kListenerEvent, pool, kNoSlot, 0), Disposal::kDeliver);
  EXPECT_EQ(RouteEntryAtConsumer(EntryKind::kCompletion, pool, static_cast<uint32_t>(index), 3),
            Disposal::kDeliver);
  EXPECT_EQ(RouteEntryAtConsumer(EntryKind::kCompletion, pool, static_cast<uint32_t>(index), 2),
            Disposal::kOrphan);
}

}  // namespace
}  // namespace cqd::internal
