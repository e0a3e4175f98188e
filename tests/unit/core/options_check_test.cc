// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/options_check.h: CheckOptions takes every RuntimeOptions within its documented
// bounds, the bounds themselves included, and refuses each option past them with
// kInvalidArgument naming that option (and the entry, in a list) and the value it was given;
// of several bad options it names the first it checks. Lanes that could not fit the address
// space are refused with kResourceExhausted. CPUs are checked against the process's
// affinity, except where options.h says an entry is ignored.
#include "runtime/core/options_check.h"

#include <sched.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace cqd::internal {
namespace {

using std::chrono::hours;
using std::chrono::microseconds;

// Refused, with every part of `mentions` in the message.
void ExpectRefused(const RuntimeOptions& options, std::initializer_list<std::string> mentions) {
  const Status s = CheckOptions(options);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& part : mentions) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message() << " (" << part << ")";
  }
}

// A CPU this process may run on, and one it may not (-1 if every CPU of the set is allowed).
int AllowedCpu(bool allowed) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set) == allowed) return cpu;
  }
  return -1;
}

TEST(CheckOptions, TheDefaultsAndEveryBoundPass) {
  EXPECT_TRUE(CheckOptions(RuntimeOptions{}).ok());
  RuntimeOptions o;
  o.pollers = 256;
  o.engine_shards = {0, 255};
  o.poll_batch = 1024;
  o.idle_budget = hours(24);
  o.cq_park_after = microseconds(0);
  o.ack_threshold = 1;
  o.stats_socket_mode = 0777;
  o.max_registrations = 1u << 24;
  o.consumers.assign(1024, ConsumerOptions{});
  o.consumers[0].queue_capacity = 1u << 26;
  o.consumers[0].spill_capacity = 1u << 20;
  o.consumers[0].dispatch_batch = 1024;
  o.consumers[0].idle_spin = hours(24);
  o.consumers[1].kind = ConsumerKind::kRunToCompletion;
  o.consumers[1].poller = 255;
  o.consumers[2].queue_capacity = 1;
  o.consumers[2].spill_capacity = 1;
  o.consumers[2].dispatch_batch = 1;
  const Status s = CheckOptions(o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  o.stats_socket_mode = 0200;  // the owner may connect: enough
  EXPECT_TRUE(CheckOptions(o).ok());
}

// Every capacity at its bound on every consumer: each option is within its bounds, but the lanes
// (256 x 1024 of them, 2^26 + 2^20 entries each) could never be reserved. Refused before
// anything is reserved (it used to reserve until memory ran out: minutes on a small machine).
TEST(CheckOptions, LanesThatCannotFitTheAddressSpaceAreRefusedAtOnce) {
  RuntimeOptions o;
  o.pollers = 256;
  o.consumers.assign(1024, ConsumerOptions{});
  for (ConsumerOptions& c : o.consumers) {
    c.queue_capacity = 1u << 26;
    c.spill_capacity = 1u << 20;
  }
  const Status s = CheckOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("address space"), std::string::npos) << s.message();
  o.consumers.resize(8);  // about 9 TiB of address space: fits
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, ShardsAndPollers) {
  RuntimeOptions o;
  o.pollers = 0;
  ExpectRefused(o, {"pollers is 0", "1..256"});
  o.pollers = 257;
  ExpectRefused(o, {"pollers is 257"});
  o = {};
  o.pollers = 2;
  o.engine_shards = {1, 2};
  ExpectRefused(o, {"engine_shards[1] is 2", "0..1"});
  o.engine_shards = {-1};
  ExpectRefused(o, {"engine_shards[0] is -1"});
  o.engine_shards = {1, 0, 1};
  ExpectRefused(o, {"engine_shards names shard 1 twice"});
  o = {};
  o.poll_batch = 0;
  ExpectRefused(o, {"poll_batch is 0"});
  o.poll_batch = 1025;
  ExpectRefused(o, {"poll_batch is 1025"});
  o = {};
  o.ack_threshold = 0;
  ExpectRefused(o, {"ack_threshold"});
  o = {};
  o.max_registrations = 0;
  ExpectRefused(o, {"max_registrations is 0"});
  o.max_registrations = (1u << 24) + 1;
  ExpectRefused(o, {"max_registrations is 16777217", "1..16777216"});
}

// Waits are compared in nanoseconds: past a day (up to microseconds::max(), which would overflow
// there) they are refused, as are negative ones.
TEST(CheckOptions, WaitsFromNothingToADay) {
  RuntimeOptions o;
  o.idle_budget = microseconds(-1);
  ExpectRefused(o, {"idle_budget is -1 us"});
  o.idle_budget = hours(24) + microseconds(1);
  ExpectRefused(o, {"idle_budget is 86400000001 us", "(one day)"});
  o.idle_budget = microseconds::max();
  ExpectRefused(o, {"idle_budget"});
  o = {};
  o.cq_park_after = hours(25);
  ExpectRefused(o, {"cq_park_after"});
  o = {};
  o.consumers.assign(2, ConsumerOptions{});
  o.consumers[1].idle_spin = microseconds(-5);
  ExpectRefused(o, {"consumers[1].idle_spin is -5 us"});
}

TEST(CheckOptions, EachConsumerByItsIndex) {
  RuntimeOptions o;
  o.consumers.clear();
  ExpectRefused(o, {"consumers has 0 entries", "1..1024"});
  o.consumers.assign(1025, ConsumerOptions{});
  ExpectRefused(o, {"consumers has 1025 entries"});
  o.consumers.assign(3, ConsumerOptions{});
  o.consumers[2].queue_capacity = 0;
  ExpectRefused(o, {"consumers[2].queue_capacity is 0"});
  o.consumers[2].queue_capacity = (1u << 26) + 1;
  ExpectRefused(o, {"consumers[2].queue_capacity is 67108865", "1..67108864"});
  o.consumers[2].queue_capacity = SIZE_MAX;  // named as given, not wrapped to a negative number
  ExpectRefused(o, {"consumers[2].queue_capacity is " + std::to_string(SIZE_MAX)});
  o.consumers[2] = {};
  o.consumers[1].spill_capacity = 0;
  ExpectRefused(o, {"consumers[1].spill_capacity is 0"});
  o.consumers[1].spill_capacity = (1u << 20) + 1;
  ExpectRefused(o, {"consumers[1].spill_capacity is 1048577"});
  o.consumers[1] = {};
  o.consumers[0].dispatch_batch = 0;
  ExpectRefused(o, {"consumers[0].dispatch_batch is 0"});
  o.consumers[0].dispatch_batch = 1025;
  ExpectRefused(o, {"consumers[0].dispatch_batch is 1025"});
  o.consumers[0] = {};
  o.consumers[1].kind = static_cast<ConsumerKind>(77);
  ExpectRefused(o, {"consumers[1].kind is not a ConsumerKind"});
}

TEST(CheckOptions, RunToCompletionConsumersBelongToAPoller) {
  RuntimeOptions o;
  o.pollers = 2;
  o.consumers.assign(2, ConsumerOptions{});
  o.consumers[1].kind = ConsumerKind::kRunToCompletion;
  o.consumers[1].poller = 2;
  ExpectRefused(o, {"consumers[1].poller is 2", "0..1"});
  o.consumers[1].poller = -1;
  ExpectRefused(o, {"consumers[1].poller is -1"});
  o.consumers[1].poller = 1;
  EXPECT_TRUE(CheckOptions(o).ok());
  o.consumers[1].cpu = 0;  // it runs on its poller's thread
  ExpectRefused(o, {"consumers[1].cpu is 0", "must be -1"});
  o.consumers[0].poller = 5;  // read only for kRunToCompletion
  o.consumers[1].cpu = -1;
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, CpusAreOnesThisProcessMayRunOnUnlessIgnored) {
  const int allowed = AllowedCpu(true);
  ASSERT_GE(allowed, 0);
  RuntimeOptions o;
  o.pollers = 2;
  o.poller_cpus = {allowed};
  ExpectRefused(o, {"poller_cpus has 1 entries", "one per poller (2)"});
  o.poller_cpus = {allowed, allowed};
  EXPECT_TRUE(CheckOptions(o).ok());
  o.poller_cpus = {allowed, CPU_SETSIZE};
  ExpectRefused(o, {"poller_cpus[1]: CPU " + std::to_string(CPU_SETSIZE)});
  o.engine_shards = {1};  // shard 1's entry is ignored: the engine places its threads
  EXPECT_TRUE(CheckOptions(o).ok());
  o.poller_cpus = {-1, allowed};
  ExpectRefused(o, {"poller_cpus[0]: CPU -1"});
  if (const int forbidden = AllowedCpu(false); forbidden >= 0) {
    o.poller_cpus = {forbidden, allowed};
    ExpectRefused(o, {"poller_cpus[0]: CPU " + std::to_string(forbidden)});
  }
  o = {};
  o.consumers.assign(2, ConsumerOptions{});
  o.consumers[1].cpu = allowed;
  EXPECT_TRUE(CheckOptions(o).ok());
  o.consumers[1].cpu = -7;
  ExpectRefused(o, {"consumers[1].cpu: CPU -7"});
  o.consumers[1].kind = ConsumerKind::kEngineDriven;  // the engine's thread: ignored
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, TheStatsEndpointsOptions) {
  RuntimeOptions o;
  o.stats_socket_mode = 01000;
  ExpectRefused(o, {"stats_socket_mode is 01000"});
  o.stats_socket_mode = 0444;  // the owner could not connect
  ExpectRefused(o, {"stats_socket_mode is 0444", "(0200)"});
  o = {};
  o.stats_tcp = "127.0.0.1";
  ExpectRefused(o, {"stats_tcp"});
  o.stats_tcp = "10.0.0.1:9464";
  ExpectRefused(o, {"stats_tcp_allow_remote"});
  o.stats_tcp_allow_remote = true;
  EXPECT_TRUE(CheckOptions(o).ok());
  o = {};
  o.stats_socket = "/tmp/" + std::string(200, 's');
  ExpectRefused(o, {"stats_socket is 205 bytes long"});
  o.stats_socket = "relative.sock";  // the file system is not looked at here
  EXPECT_TRUE(CheckOptions(o).ok());
}

TEST(CheckOptions, OfSeveralBadOptionsTheFirstCheckedIsNamed) {
  RuntimeOptions o;
  o.pollers = 0;
  o.poll_batch = 0;
  o.consumers.clear();
  ExpectRefused(o, {"pollers is 0"});
  o.pollers = 1;
  ExpectRefused(o, {"poll_batch is 0"});
  o.poll_batch = 1;
  ExpectRefused(o, {"consumers has 0 entries"});
}

}  // namespace
}  // namespace cqd::internal
