// SPDX-License-Identifier: BSD-2-Clause
// Consumer (runtime/core/consumer.h): dispatch of lane ranges (handed over by publishing the
// lane's position) and of Items that travel alone, across Dispatch calls whose `max` splits a
// range, with more Items queued between the calls; an Item between two ranges, and a lane that
// rewinds to its start.
#include "runtime/core/consumer.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fixtures/fixtures.h"

namespace cqd::internal {
namespace {

using ::cqd::testing::Recorder;

class ConsumerTest : public ::testing::Test {
 protected:
  explicit ConsumerTest(size_t queue_capacity = 64, int pollers = 1)
      : slots_(16), orphans_(nullptr) {
    options_.kind = ConsumerKind::kEngineDriven;
    options_.name = "c";
    options_.dispatch_batch = 8;
    options_.queue_capacity = queue_capacity;
    options_.spill_capacity = 16;
    consumer_ = std::make_unique<Consumer>(0, options_, slots_, orphans_, pollers);
    token_ = std::make_unique<moodycamel::ProducerToken>(consumer_->MakeProducerToken());
    slot_ = static_cast<uint32_t>(slots_.Allocate());
    Slot& slot = slots_.slot(slot_);
    slot.handler.store(&handler_);
    slot.state.store(MakeState(1, 0, /*live=*/true));
  }

  // Writes completions `tags` into lane `l` and hands them over as one range.
  void PushRange(const std::vector<uint64_t>& tags, int l = 0) {
    Lane& lane = consumer_->lane(l);
    for (size_t k = 0; k < tags.size(); ++k) {
      ASSERT_GT(lane.room(), 0u);
      const uint32_t at = lane.tail_at();
      lane.wc(at) = ibv_wc{};
      lane.wc(at).wr_id = tags[k];
      lane.meta(at) = {slot_, 1, EntryKind::kCompletion, static_cast<uint16_t>(tags.size() - k), 0};
      lane.Append();
    }
    consumer_->Reserve(tags.size());
    lane.Publish(static_cast<uint32_t>(tags.size()));
    consumer_->HandedOver();
  }
  // Hands over one completion as an Item of its own, behind what lane `l` handed over.
  void PushAlone(uint64_t tag, int l = 0) {
    Item item;
    item.wc.wr_id = tag;
    item.slot = slot_;
    item.generation = 1;
    item.kind = EntryKind::kCompletion;
    item.shard = static_cast<uint32_t>(l);
    item.after = consumer_->lane(l).published();
    consumer_->Reserve(1);
    consumer_->PushAlone(*token_, item);
  }

  ConsumerOptions options_;
  SlotPool slots_;
  OrphanSink orphans_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<moodycamel::ProducerToken> token_;
  uint32_t slot_ = 0;
  Recorder handler_;
};

TEST_F(ConsumerTest, ItemsQueuedBetweenTwoDrainsArriveOnceAndInOrder) {
  PushRange({1, 2});
  PushAlone(3);
  EXPECT_EQ(consumer_->Drain(1), 1);  // takes the range and the Item off the queue, runs 1
  PushAlone(4);
  PushAlone(5);
  int dispatched = 0;
  for (int round = 0; round < 10 && dispatched < 4; ++round) dispatched += consumer_->Drain(8);
  EXPECT_EQ(dispatched, 4);
  EXPECT_EQ(handler_.wr_ids(), std::vector<uint64_t>({1, 2, 3, 4, 5}));
  EXPECT_EQ(consumer_->depth(), 0u);
}

TEST_F(ConsumerTest, DrainSplitsARangeAtMaxAndReleasesTheLaneBehindIt) {
  PushRange({10, 11, 12, 13, 14});
  EXPECT_EQ(consumer_->Drain(2), 2);
  EXPECT_EQ(consumer_->depth(), 3u);
  EXPECT_EQ(consumer_->Drain(2), 2);
  EXPECT_EQ(consumer_->Drain(2), 1);
  EXPECT_EQ(consumer_->Drain(2), 0);
  EXPECT_EQ(handler_.wr_ids(), std::vector<uint64_t>({10, 11, 12, 13, 14}));
  // Every entry released: the whole spill bound is free again.
  EXPECT_EQ(consumer_->lane(0).room(), 16u);
}

TEST_F(ConsumerTest, OneRegistrationsRunsThatFollowEachOtherReachTheHandlerInOneCall) {
  PushRange({1, 2});
  PushRange({3});
  PushRange({4, 5});
  EXPECT_EQ(consumer_->Drain(8), 5);
  EXPECT_EQ(handler_.wr_ids(), std::vector<uint64_t>({1, 2, 3, 4, 5}));
  EXPECT_EQ(handler_.calls(), 1u);
}

TEST_F(ConsumerTest, AnUnregisteredRegistrationsEntriesGoToTheOrphanSink) {
  PushRange({1, 2, 3});
  slots_.slot(slot_).state.store(MakeState(2, 0, /*live=*/false));
  EXPECT_EQ(consumer_->Drain(8), 3);
  EXPECT_TRUE(handler_.wr_ids().empty());
  EXPECT_EQ(orphans_.total(), 3u);
}

TEST_F(ConsumerTest, RangesOnBothSidesOfTheRingEdgeStayTwoSpans) {
  // The lane holds 64 + 16 = 80 entries: fill and drain 78, then hand over 2 + 2 across the edge.
  for (int k = 0; k < 13; ++k) {
    PushRange({0, 0, 0, 0, 0, 0});
    consumer_->Drain(8);
  }
  const size_t seen_before = handler_.wr_ids().size();
  const uint64_t calls_before = handler_.calls();
  EXPECT_EQ(consumer_->lane(0).tail_at(), 78u);
  PushRange({1, 2});
  PushRange({3, 4});
  EXPECT_EQ(consumer_->Drain(8), 4);
  const std::vector<uint64_t> seen = handler_.wr_ids();
  EXPECT_EQ(std::vector<uint64_t>(seen.begin() + seen_before, seen.end()),
            std::vector<uint64_t>({1, 2, 3, 4}));
  EXPECT_EQ(handler_.calls() - calls_before, 2u);
}

TEST_F(ConsumerTest, AnItemBetweenTwoRangesArrivesBetweenThem) {
  PushRange({1, 2});
  PushAlone(3);
  PushRange({4, 5});
  PushAlone(6);
  EXPECT_EQ(consumer_->Drain(8), 6);
  EXPECT_EQ(handler_.wr_ids(), std::vector<uint64_t>({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(consumer_->depth(), 0u);
}

TEST_F(ConsumerTest, DestructionHandsWhatIsLeftToTheOrphanSink) {
  PushRange({1, 2, 3});
  PushAlone(4);
  EXPECT_EQ(consumer_->Drain(1), 1);
  consumer_->OrphanRemaining();
  EXPECT_EQ(handler_.wr_ids(), std::vector<uint64_t>({1}));
  EXPECT_EQ(orphans_.total(), 3u);
}

class TwoLaneConsumerTest : public ConsumerTest {
 protected:
  TwoLaneConsumerTest() : ConsumerTest(/*queue_capacity=*/64, /*pollers=*/2) {}
};

// A batch takes at most dispatch_batch (8) items off the queue. With eight of lane 1's taken, the
// item of lane 0 is still queued: lane 0 must not be read past it.
TEST_F(TwoLaneConsumerTest, ALaneIsNotReadPastAnItemStillQueued) {
  for (uint64_t tag = 100; tag < 108; ++tag) PushAlone(tag, /*l=*/1);
  PushRange({1, 2}, /*l=*/0);
  PushAlone(50, /*l=*/0);
  PushRange({3, 4}, /*l=*/0);
  int dispatched = 0;
  for (int round = 0; round < 10 && dispatched < 13; ++round) dispatched += consumer_->Drain(8);
  EXPECT_EQ(dispatched, 13);
  std::vector<uint64_t> lane0;
  for (uint64_t tag : handler_.wr_ids()) {
    if (tag < 100) lane0.push_back(tag);
  }
  EXPECT_EQ(lane0, std::vector<uint64_t>({1, 2, 50, 3, 4}));
  EXPECT_EQ(consumer_->depth(), 0u);
}

class RewindingConsumerTest : public ConsumerTest {
 protected:
  RewindingConsumerTest() : ConsumerTest(/*queue_capacity=*/4096) {}
};

TEST_F(RewindingConsumerTest, ALaneThatRewindsToItsStartHandsOverEveryEntryInOrder) {
  Lane& lane = consumer_->lane(0);
  uint64_t tag = 0;
  uint32_t highest_at = 0;
  bool rewound = false;
  std::vector<uint64_t> expected;
  for (int round = 0; round < 200 && !rewound; ++round) {
    std::vector<uint64_t> tags;
    for (int k = 0; k < 7; ++k) tags.push_back(tag++);
    PushRange(tags);
    expected.insert(expected.end(), tags.begin(), tags.end());
    while (consumer_->Drain(8) > 0) {
    }
    highest_at = std::max(highest_at, lane.tail_at());
    rewound = lane.tail_at() < highest_at;
  }
  ASSERT_TRUE(rewound) << "the lane never went back to its start";
  PushRange({tag, tag + 1});  // handed over after the jump
  expected.push_back(tag);
  expected.push_back(tag + 1);
  EXPECT_EQ(consumer_->Drain(8), 2);
  EXPECT_EQ(handler_.wr_ids(), expected);
  EXPECT_EQ(consumer_->depth(), 0u);
}

}  // namespace
}  // namespace cqd::internal
