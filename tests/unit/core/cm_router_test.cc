// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/cm_router.h: a CmBinding's rule for an id's events, on the paths that hand
// nothing on (handing on goes through a poller: //tests/scenarios/cm:cm_handon_test drives those
// with the real ones). An event read while the registration is live is listed and routed; the
// consumer that reaches it while the registration is still the routed one delivers it, after
// which it has left the list; a stale part of an event that left changes nothing; a dropped
// event leaves the list without being handed on; once the registration is gone the binding
// ends, and an ended binding with nothing listed routes nothing more; an event read while a
// delivery is under way after the end waits behind it; End says whether anything still waits.
#include "runtime/core/cm_router.h"

#include <memory>

#include "gtest/gtest.h"
#include "runtime/core/registry.h"

namespace cqd::internal {
namespace {

constexpr uint32_t kGeneration = 4;
constexpr uint32_t kQpNum = 0x321;

class CmBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    index_ = static_cast<uint32_t>(slots_.Allocate());
    slot().state.store(MakeState(kGeneration, /*consumer=*/1, /*live=*/true));
    EventRoute route;
    route.slot = index_;
    route.generation = kGeneration;
    route.consumer = 1;
    binding_ = std::make_shared<CmBinding>(route, kQpNum);
  }
  Slot& slot() { return slots_.slot(index_); }
  // An event as the event thread makes it, counted in `watch_` (so its free shows there).
  EventJoin* Read(int n) {
    auto* join = new EventJoin;
    join->watch = &watch_;
    join->cm.status = n;
    watch_.unfinished.fetch_add(1);
    return join;
  }
  // What the event thread or a consumer does with the route's hold once done with the join.
  static void DropRoutesHold(EventJoin* join) { EventJoin::DropHold(join); }

  SlotPool slots_{16};
  uint32_t index_ = 0;
  CmWatch watch_;
  std::shared_ptr<CmBinding> binding_;
};

TEST_F(CmBindingTest, AnEventOfALiveRegistrationIsListedForItsConsumer) {
  EventJoin* join = Read(1);
  ASSERT_EQ(binding_->Admit(join, binding_, slots_), CmBinding::Admission::kRouted);
  EXPECT_EQ(join->kind, EventJoin::Kind::kCm);
  EXPECT_EQ(join->cm.qp_num, kQpNum);
  EXPECT_EQ(join->gate.get(), binding_.get());
  EXPECT_EQ(join->holds.load(), 2) << "the list's and the route's";
  EXPECT_FALSE(join->left);
  // The consumer reaches it, the registration still the routed one: deliver.
  ASSERT_EQ(binding_->Arrived(join, &slot()), CmEventGate::Arrival::kDeliver);
  EXPECT_TRUE(join->left);
  EXPECT_EQ(join->holds.load(), 1) << "left the list";
  EXPECT_FALSE(binding_->End()) << "a delivery under way: the end waits for it";
  binding_->Delivered();
  join->Finish();
  DropRoutesHold(join);
  EXPECT_EQ(watch_.unfinished.load(), 0);
  // Ended, nothing listed, nothing under way: the next event is the caller's to hand on.
  EventJoin* later = Read(2);
  EXPECT_EQ(binding_->Admit(later, binding_, slots_), CmBinding::Admission::kEnded);
  EXPECT_EQ(later->holds.load(), 0) << "an event it does not take is left as it was";
  EXPECT_EQ(later->gate, nullptr);
  delete later;
  EXPECT_TRUE(binding_->End());
}

// Parts of one event come from one or two pollers: a part that arrives after its event has left
// changes nothing.
TEST_F(CmBindingTest, AStalePartOfAnEventThatLeftChangesNothing) {
  EventJoin* join = Read(1);
  ASSERT_EQ(binding_->Admit(join, binding_, slots_), CmBinding::Admission::kRouted);
  ASSERT_EQ(binding_->Arrived(join, &slot()), CmEventGate::Arrival::kDeliver);
  binding_->Delivered();
  EXPECT_EQ(binding_->Arrived(join, &slot()), CmEventGate::Arrival::kDone);
  EXPECT_EQ(binding_->Arrived(join, nullptr), CmEventGate::Arrival::kDone);
  EXPECT_EQ(join->holds.load(), 1);
  DropRoutesHold(join);
  EXPECT_EQ(watch_.unfinished.load(), 0);
  // The binding did not end for it: a new event is still routed.
  EventJoin* next = Read(2);
  ASSERT_EQ(binding_->Admit(next, binding_, slots_), CmBinding::Admission::kRouted);
  binding_->Drop(next);
  DropRoutesHold(next);
}

// A part dropped (the runtime goes): the event leaves the list without being handed on, once.
TEST_F(CmBindingTest, ADroppedEventLeavesTheListWithoutBeingHandedOn) {
  EventJoin* join = Read(1);
  ASSERT_EQ(binding_->Admit(join, binding_, slots_), CmBinding::Admission::kRouted);
  binding_->Drop(join);
  EXPECT_TRUE(join->left);
  EXPECT_EQ(join->holds.load(), 1);
  binding_->Drop(join);  // left already: nothing more
  EXPECT_EQ(join->holds.load(), 1);
  EXPECT_TRUE(binding_->End()) << "nothing listed, nothing under way";
  DropRoutesHold(join);
  EXPECT_EQ(watch_.unfinished.load(), 0);
}

// The event thread finds the registration gone (unregistered, or the slot reused by another
// generation) with nothing listed: the binding ends, and routes nothing from then on, even if
// the slot is live again.
TEST_F(CmBindingTest, ARegistrationFoundGoneEndsTheBinding) {
  slot().state.store(MakeState(kGeneration + 1, 1, true));  // another registration's slot now
  EventJoin* join = Read(1);
  EXPECT_EQ(binding_->Admit(join, binding_, slots_), CmBinding::Admission::kEnded);
  slot().state.store(MakeState(kGeneration, 1, true));
  EXPECT_EQ(binding_->Admit(join, binding_, slots_), CmBinding::Admission::kEnded);
  EXPECT_TRUE(binding_->End());
  delete join;
  EXPECT_EQ(watch_.unfinished.load(), 0);
}

// Behind a delivery under way the event waits even when nothing else does: the CmHandler must
// not get it while the QP's handler still has the id's earlier one.
TEST_F(CmBindingTest, AnEventReadDuringADeliveryAfterTheEndWaitsBehindIt) {
  EventJoin* first = Read(1);
  ASSERT_EQ(binding_->Admit(first, binding_, slots_), CmBinding::Admission::kRouted);
  ASSERT_EQ(binding_->Arrived(first, &slot()), CmEventGate::Arrival::kDeliver);
  slot().state.store(MakeState(kGeneration, 1, /*live=*/false));  // unregistered meanwhile
  EventJoin* second = Read(2);
  EXPECT_EQ(binding_->Admit(second, binding_, slots_), CmBinding::Admission::kWaiting);
  EXPECT_EQ(second->kind, EventJoin::Kind::kCm);
  EXPECT_EQ(second->holds.load(), 1) << "the list's only: it is routed nowhere";
  EXPECT_FALSE(binding_->End()) << "the second waits";
  // (Delivered() would now hand the second on, through a poller; drop it instead.)
  binding_->Drop(second);  // the list's hold was its last: freed
  EXPECT_EQ(watch_.unfinished.load(), 1);
  binding_->Delivered();
  first->Finish();
  DropRoutesHold(first);
  EXPECT_EQ(watch_.unfinished.load(), 0);
  EXPECT_TRUE(binding_->End());
}

}  // namespace
}  // namespace cqd::internal
