// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/caller.h: CallerRoles() reads the marks the calling thread carries, and only its
// own (thread_role.h's runtime thread, the log sink's, the wait duty, callback scopes, and the
// engine threads a runtime lists), each undone when its scope ends; RefusalReason names the
// first role of the enum's order that the caller holds and the call refuses, and nothing when
// there is none.
#include "runtime/core/caller.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/base/log.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {
namespace {

constexpr uint32_t kRoles[] = {kRoleRuntimeThread,  kRoleLogSink,  kRoleHandler,
                               kRoleTeardownThread, kRoleWaitDuty, kRoleCallback};

uint32_t RolesOnAnotherThread() {
  uint32_t roles = ~0u;
  std::thread([&] { roles = CallerRoles(); }).join();
  return roles;
}

TEST(CallerRoles, AThreadOutsideEveryCallbackHasNone) {
  EXPECT_EQ(CallerRoles(), 0u);
  EXPECT_EQ(RolesOnAnotherThread(), 0u);
}

TEST(CallerRoles, ARuntimeThreadScopeMarksItsThreadUntilItEnds) {
  {
    const RuntimeThreadScope runtime(true);
    EXPECT_EQ(CallerRoles(), kRoleRuntimeThread);
    EXPECT_EQ(RolesOnAnotherThread(), 0u) << "the mark is the thread's own";
    {
      const RuntimeThreadScope not_runtime(false);  // a run-to-completion handler's scope
      EXPECT_EQ(CallerRoles(), 0u);
    }
    EXPECT_EQ(CallerRoles(), kRoleRuntimeThread) << "the inner scope restored the outer's mark";
  }
  EXPECT_EQ(CallerRoles(), 0u);
}

TEST(CallerRoles, MarkRuntimeThreadMarksOnlyTheThreadThatCallsIt) {
  uint32_t marked = 0;
  std::thread([&] {
    MarkRuntimeThread();
    marked = CallerRoles();
  }).join();
  EXPECT_EQ(marked, kRoleRuntimeThread);
  EXPECT_EQ(CallerRoles(), 0u);
}

TEST(CallerRoles, TheLogSinkIsMarkedWhileItRunsAndOnlyThen) {
  uint32_t in_sink = 0;
  uint32_t in_sink_on_runtime_thread = 0;
  const Logger log([&](LogLevel, std::string_view message) {
    (message == "runtime" ? in_sink_on_runtime_thread : in_sink) = CallerRoles();
  });
  log.Info("plain");
  EXPECT_EQ(in_sink, kRoleLogSink);
  EXPECT_EQ(CallerRoles(), 0u);
  {
    const RuntimeThreadScope runtime(true);
    log.Warning("runtime");
  }
  EXPECT_EQ(in_sink_on_runtime_thread, kRoleLogSink | kRoleRuntimeThread);
  // A sink that logs again (through the same logger) keeps the mark after the inner call.
  uint32_t after_inner = 0;
  const Logger* self = nullptr;
  const Logger nested([&](LogLevel level, std::string_view) {
    if (level == LogLevel::kError) self->Debug("inner");
    after_inner = CallerRoles();
  });
  self = &nested;
  nested.Error("outer");
  EXPECT_EQ(after_inner, kRoleLogSink);
  EXPECT_EQ(CallerRoles(), 0u);
}

TEST(CallerRoles, CallbackScopesNest) {
  {
    const CallbackScope outer;
    EXPECT_EQ(CallerRoles(), kRoleCallback);
    {
      const CallbackScope inner;
      EXPECT_EQ(CallerRoles(), kRoleCallback);
    }
    EXPECT_EQ(CallerRoles(), kRoleCallback) << "the outer callback is still running";
  }
  EXPECT_EQ(CallerRoles(), 0u);
}

int served = 0;
void Serve(void* owner) { served += *static_cast<int*>(owner); }

// Run-to-completion handlers on a poller: the wait duty is set and the runtime-thread mark
// taken away (the handlers may call the runtime), both back as they were afterwards; a wait
// step there serves the duty.
TEST(CallerRoles, HostedDispatchGivesTheWaitDutyAndLiftsTheRuntimeMark) {
  int owner = 1;
  served = 0;
  const RuntimeThreadScope poller(true);
  {
    const HostedDispatchScope dispatching(&Serve, &owner);
    EXPECT_EQ(CallerRoles(), kRoleWaitDuty);
    EXPECT_TRUE(ServingAs(&owner));
    WaitStep();
    EXPECT_EQ(served, 1);
  }
  EXPECT_EQ(CallerRoles(), kRoleRuntimeThread);
  EXPECT_FALSE(ServingAs(&owner));
  WaitStep();  // no duty now: serves nothing
  EXPECT_EQ(served, 1);
}

// The engine threads of a runtime (the last drainer of each engine-driven consumer, the last
// driver of each engine-driven shard) are named by their ThreadToken: a thread is one only when
// it is listed, and only when the caller asks about that runtime's list.
TEST(CallerRoles, AnEngineThreadIsOneWhoseTokenIsListed) {
  std::atomic<uintptr_t> mine{ThreadToken()};
  std::atomic<uintptr_t> nobody{0};
  const EngineThreads listed = {&nobody, &mine};
  const EngineThreads others = {&nobody};
  EXPECT_EQ(CallerRoles(&listed), kRoleEngineThread);
  EXPECT_EQ(CallerRoles(&others), 0u);
  EXPECT_EQ(CallerRoles(), 0u) << "no runtime asked about";
  uint32_t elsewhere = ~0u;
  std::thread([&] { elsewhere = CallerRoles(&listed); }).join();
  EXPECT_EQ(elsewhere, 0u) << "another thread's token";
  {
    const CallbackScope callback;
    EXPECT_EQ(CallerRoles(&listed), kRoleEngineThread | kRoleCallback);
  }
  EXPECT_EQ(kEveryRole & kRoleEngineThread, 0u) << "an engine thread is no callback";
}

TEST(CallerRoles, EveryRoleIsItsOwnBitOfEveryRole) {
  uint32_t all = 0;
  for (uint32_t role : kRoles) {
    EXPECT_EQ(role & (role - 1), 0u) << "one bit";
    EXPECT_EQ(all & role, 0u) << "a bit of its own";
    EXPECT_EQ(kEveryRole & role, role);
    all |= role;
  }
  EXPECT_EQ(all, kEveryRole) << "kEveryRole holds nothing but the roles";
}

TEST(RefusalReason, NoneWhenTheCallerHoldsNoRoleTheCallRefuses) {
  EXPECT_EQ(RefusalReason(0, kEveryRole), nullptr);
  EXPECT_EQ(RefusalReason(kEveryRole, 0), nullptr);
  EXPECT_EQ(RefusalReason(kRoleHandler | kRoleCallback, kRoleRuntimeThread | kRoleLogSink),
            nullptr);
}

TEST(RefusalReason, EachRoleHasItsOwnReason) {
  const char* const words[] = {"poller or event thread", "log sink", "handler", "on_done",
                               "run-to-completion",      "callback"};
  std::set<std::string> reasons;
  for (size_t i = 0; i < std::size(kRoles); ++i) {
    const char* reason = RefusalReason(kRoles[i], kEveryRole);
    ASSERT_NE(reason, nullptr) << i;
    EXPECT_NE(std::strstr(reason, words[i]), nullptr) << reason;
    EXPECT_EQ(std::string(reason).rfind("called from ", 0), 0u) << reason;
    reasons.insert(reason);
  }
  EXPECT_EQ(reasons.size(), std::size(kRoles));
}

TEST(RefusalReason, AnEngineThreadHasItsOwnReasonAfterTheCallbackRoles) {
  const char* engine = RefusalReason(kRoleEngineThread, kRoleEngineThread);
  ASSERT_NE(engine, nullptr);
  EXPECT_NE(std::strstr(engine, "engine-driven"), nullptr) << engine;
  for (uint32_t role : kRoles) EXPECT_STRNE(RefusalReason(role, role), engine);
  EXPECT_EQ(RefusalReason(kRoleEngineThread, kEveryRole), nullptr) << "not refused: no reason";
  EXPECT_STREQ(RefusalReason(kRoleEngineThread | kRoleCallback, kEveryRole | kRoleEngineThread),
               RefusalReason(kRoleCallback, kRoleCallback));
}

TEST(RefusalReason, NamesTheFirstRoleInTheEnumsOrderThatBothHold) {
  auto reason_of = [](uint32_t role) { return std::string(RefusalReason(role, role)); };
  EXPECT_EQ(RefusalReason(kEveryRole, kEveryRole), reason_of(kRoleRuntimeThread));
  EXPECT_EQ(RefusalReason(kRoleCallback | kRoleHandler, kEveryRole), reason_of(kRoleHandler));
  // The first role that both hold, not the caller's first role.
  EXPECT_EQ(RefusalReason(kEveryRole, kRoleCallback | kRoleTeardownThread),
            reason_of(kRoleTeardownThread));
  EXPECT_EQ(RefusalReason(kRoleLogSink | kRoleWaitDuty, kRoleWaitDuty), reason_of(kRoleWaitDuty));
}

}  // namespace
}  // namespace cqd::internal
