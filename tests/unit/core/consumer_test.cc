// SPDX-License-Identifier: BSD-2-Clause
// Consumer (runtime/core/consumer.h): dispatch of lane ranges and of Items that travel alone,
// across Dispatch calls whose `max` splits a range, with more Items queued between the calls.
#include "runtime/core/consumer.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

class RecordingHandler : public QpHandler {
 public:
  void OnCompletions(std::span<const ibv_wc> wcs) noexcept override {
    for (const ibv_wc& wc : wcs) seen.push_back(wc.wr_id);
    ++calls;
  }
  std::vector<uint64_t> seen;
  int calls = 0;
};

class ConsumerTest : public ::testing::Test {
 protected:
  ConsumerTest() : slots_(16), orphans_(nullptr) {
    options_.kind = ConsumerKind::kEngineDriven;
    options_.name = "c";
    options_.dispatch_batch = 8;
    options_.queue_capacity = 64;
    options_.spill_capacity = 16;
    consumer_ = std::make_unique<Consumer>(0, options_, slots_, orphans_, /*pollers=*/1);
    token_ = std::make_unique<moodycamel::ProducerToken>(consumer_->MakeProducerToken());
    slot_ = static_cast<uint32_t>(slots_.Allocate());
    Slot& slot = slots_.slot(slot_);
    slot.handler.store(&handler_);
    slot.state.store(MakeState(1, 0, /*live=*/true));
  }

  // Writes completions `tags` into the lane and hands them over as one range.
  void PushRange(const std::vector<uint64_t>& tags) {
    Lane& lane = consumer_->lane(0);
    const uint64_t begin = lane.published();
    for (size_t k = 0; k < tags.size(); ++k) {
      const uint32_t at = lane.tail_at();
      lane.wc(at) = ibv_wc{};
      lane.wc(at).wr_id = tags[k];
      lane.meta(at) = {slot_, 1, EntryKind::kCompletion, static_cast<uint16_t>(tags.size() - k), 0};
      lane.Append();
    }
    lane.PopFront(static_cast<uint32_t>(tags.size()));
    Item item;
    item.kind = EntryKind::kLaneRun;
    item.run = {begin, static_cast<uint32_t>(tags.size()), 0, false};
    consumer_->Reserve(tags.size());
    consumer_->Push(*token_, &item, 1);
  }
  // Hands over one completion as an Item of its own.
  void PushAlone(uint64_t tag) {
    Item item;
    item.wc.wr_id = tag;
    item.slot = slot_;
    item.generation = 1;
    item.kind = EntryKind::kCompletion;
    consumer_->Reserve(1);
    consumer_->Push(*token_, &item, 1);
  }

  ConsumerOptions options_;
  SlotPool slots_;
  OrphanSink orphans_;
  std::unique_ptr<Consumer> consumer_;
  std::unique_ptr<moodycamel::ProducerToken> token_;
  uint32_t slot_ = 0;
  RecordingHandler handler_;
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
  EXPECT_EQ(handler_.seen, std::vector<uint64_t>({1, 2, 3, 4, 5}));
  EXPECT_EQ(consumer_->depth(), 0u);
}

TEST_F(ConsumerTest, DrainSplitsARangeAtMaxAndReleasesTheLaneBehindIt) {
  PushRange({10, 11, 12, 13, 14});
  EXPECT_EQ(consumer_->Drain(2), 2);
  EXPECT_EQ(consumer_->depth(), 3u);
  EXPECT_EQ(consumer_->Drain(2), 2);
  EXPECT_EQ(consumer_->Drain(2), 1);
  EXPECT_EQ(consumer_->Drain(2), 0);
  EXPECT_EQ(handler_.seen, std::vector<uint64_t>({10, 11, 12, 13, 14}));
  // Every entry released: the whole spill bound is free again.
  EXPECT_EQ(consumer_->lane(0).room(), 16u);
}

TEST_F(ConsumerTest, OneRegistrationsRunsThatFollowEachOtherReachTheHandlerInOneCall) {
  PushRange({1, 2});
  PushRange({3});
  PushRange({4, 5});
  EXPECT_EQ(consumer_->Drain(8), 5);
  EXPECT_EQ(handler_.seen, std::vector<uint64_t>({1, 2, 3, 4, 5}));
  EXPECT_EQ(handler_.calls, 1);
}

TEST_F(ConsumerTest, AnUnregisteredRegistrationsEntriesGoToTheOrphanSink) {
  PushRange({1, 2, 3});
  slots_.slot(slot_).state.store(MakeState(2, 0, /*live=*/false));
  EXPECT_EQ(consumer_->Drain(8), 3);
  EXPECT_TRUE(handler_.seen.empty());
  EXPECT_EQ(orphans_.total(), 3u);
}

TEST_F(ConsumerTest, RangesOnBothSidesOfTheRingEdgeStayTwoSpans) {
  // The lane holds 64 + 16 = 80 entries: fill and drain 78, then hand over 2 + 2 across the edge.
  for (int k = 0; k < 13; ++k) {
    PushRange({0, 0, 0, 0, 0, 0});
    consumer_->Drain(8);
  }
  handler_.seen.clear();
  handler_.calls = 0;
  EXPECT_EQ(consumer_->lane(0).tail_at(), 78u);
  PushRange({1, 2});
  PushRange({3, 4});
  EXPECT_EQ(consumer_->Drain(8), 4);
  EXPECT_EQ(handler_.seen, std::vector<uint64_t>({1, 2, 3, 4}));
  EXPECT_EQ(handler_.calls, 2);
}

}  // namespace
}  // namespace cqd::internal
