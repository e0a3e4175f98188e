// SPDX-License-Identifier: BSD-2-Clause
// Mailbox (runtime/base/mailbox.h): posted functions run on the owner, in order, exactly once;
// before Open and after Close they run inline on the caller; a caller with a wait duty
// (runtime/base/thread_role.h) serves it while it waits.
#include "runtime/base/mailbox.h"

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/parker.h"
#include "runtime/base/thread_role.h"

namespace cqd::internal {
namespace {

// Spins (yielding) until `done()`. Only waits for another thread's step that the test's own logic
// guarantees; the test's timeout is the hang guard.
void Await(const std::function<bool()>& done) {
  while (!done()) std::this_thread::yield();
}

// An owner thread that sleeps on a Parker and runs what is posted to its mailbox, as a poller
// does between its passes, until Stop(); then it closes the mailbox.
class OwnerThread {
 public:
  OwnerThread() {
    mailbox_.Open();
    thread_ = std::thread([this] { Loop(); });
  }
  ~OwnerThread() { Stop(); }

  void Stop() {
    if (!thread_.joinable()) return;
    stop_.store(true, std::memory_order_seq_cst);
    parker_.Wake();
    thread_.join();
  }
  void RunSync(const std::function<void()>& fn) {
    mailbox_.RunSync(fn, [this] { parker_.Wake(); });
  }
  std::thread::id id() const { return thread_.get_id(); }

 private:
  void Loop() {
    while (true) {
      if (mailbox_.pending()) {
        mailbox_.RunPosted();
        continue;
      }
      if (stop_.load(std::memory_order_seq_cst)) break;
      const uint32_t ticket = parker_.Prepare();
      if (mailbox_.pending() || stop_.load(std::memory_order_seq_cst)) {
        parker_.Cancel();
        continue;
      }
      parker_.Park(ticket);
    }
    mailbox_.Close();
  }

  Mailbox mailbox_;
  Parker parker_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(Mailbox, RunSyncRunsOnTheOwnerAndReturnsAfterwards) {
  OwnerThread owner;
  std::thread::id ran_on;
  int runs = 0;  // written on the owner, read here after RunSync returns
  owner.RunSync([&] {
    ran_on = std::this_thread::get_id();
    ++runs;
  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ran_on, owner.id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(Mailbox, ManyPostersEachFunctionRunsExactlyOnceOnTheOwner) {
  constexpr int kPosters = 4;
  constexpr int kPosts = 300;
  OwnerThread owner;
  const std::thread::id owner_id = owner.id();
  // Touched only on the owner thread (the functions run there); read after the posters joined.
  std::vector<std::vector<int>> runs(kPosters, std::vector<int>(kPosts, 0));
  std::vector<int> log;  // poster * kPosts + post, in the order the owner ran them
  int not_on_owner = 0;
  std::atomic<int> not_seen_on_return{0};
  std::vector<std::thread> posters;
  for (int p = 0; p < kPosters; ++p) {
    posters.emplace_back([&, p] {
      for (int i = 0; i < kPosts; ++i) {
        bool ran = false;  // this thread's, set by the owner: RunSync returns after it ran
        owner.RunSync([&] {
          if (std::this_thread::get_id() != owner_id) ++not_on_owner;
          ++runs[p][i];
          log.push_back(p * kPosts + i);
          ran = true;
        });
        if (!ran) not_seen_on_return.fetch_add(1);
      }
    });
  }
  for (std::thread& t : posters) t.join();
  owner.Stop();

  EXPECT_EQ(not_on_owner, 0);
  EXPECT_EQ(not_seen_on_return.load(), 0);
  for (int p = 0; p < kPosters; ++p) {
    for (int i = 0; i < kPosts; ++i) ASSERT_EQ(runs[p][i], 1) << p << "/" << i;
  }
  // Each poster's functions ran in the order it posted them.
  ASSERT_EQ(log.size(), static_cast<size_t>(kPosters * kPosts));
  std::vector<int> next(kPosters, 0);
  for (int entry : log) {
    const int p = entry / kPosts;
    EXPECT_EQ(entry % kPosts, next[p]) << "poster " << p;
    next[p] = entry % kPosts + 1;
  }
}

// The test thread is the owner and decides when to run: functions posted by several threads
// before it does run in the order they were posted, in one RunPosted, on the owner.
TEST(Mailbox, PostedFunctionsRunInPostingOrder) {
  constexpr int kPosters = 5;
  Mailbox mailbox;
  mailbox.Open();
  EXPECT_FALSE(mailbox.pending());
  std::atomic<int> wakes{0};
  std::vector<int> order;  // owner only
  std::vector<std::thread::id> ran_on;
  std::vector<std::thread> posters;
  for (int p = 0; p < kPosters; ++p) {
    posters.emplace_back([&, p] {
      mailbox.RunSync(
          [&, p] {
            order.push_back(p);
            ran_on.push_back(std::this_thread::get_id());
          },
          [&] { wakes.fetch_add(1, std::memory_order_seq_cst); });
    });
    // wake_owner is called after the post: poster p is in before poster p + 1 starts.
    Await([&] { return wakes.load(std::memory_order_seq_cst) == p + 1; });
    EXPECT_TRUE(mailbox.pending());
    EXPECT_TRUE(order.empty());  // nothing runs until the owner does
  }
  mailbox.RunPosted();
  for (std::thread& t : posters) t.join();
  EXPECT_FALSE(mailbox.pending());
  EXPECT_EQ(order, std::vector<int>({0, 1, 2, 3, 4}));
  for (const std::thread::id& id : ran_on) EXPECT_EQ(id, std::this_thread::get_id());
  // Nothing left: another RunPosted runs nothing again.
  mailbox.RunPosted();
  EXPECT_EQ(order.size(), static_cast<size_t>(kPosters));
  mailbox.Close();
}

TEST(Mailbox, RunsInlineBeforeOpen) {
  Mailbox mailbox;
  bool woke = false;
  std::thread::id ran_on;
  std::thread caller([&] {
    mailbox.RunSync([&] { ran_on = std::this_thread::get_id(); }, [&] { woke = true; });
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  });
  caller.join();
  EXPECT_FALSE(woke);  // nobody to wake
  EXPECT_FALSE(mailbox.pending());
}

TEST(Mailbox, CloseRunsWhatWasPostedThenLaterCallsRunInline) {
  Mailbox mailbox;
  mailbox.Open();
  std::atomic<bool> posted{false};
  std::thread::id ran_on;
  int runs = 0;
  std::thread poster([&] {
    mailbox.RunSync(
        [&] {
          ran_on = std::this_thread::get_id();
          ++runs;
        },
        [&] { posted.store(true, std::memory_order_seq_cst); });
  });
  Await([&] { return posted.load(std::memory_order_seq_cst); });
  mailbox.Close();  // the owner stops: runs what was posted first
  poster.join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_FALSE(mailbox.pending());

  // Closed: RunSync runs the function on its caller, without waking anyone.
  bool woke = false;
  std::thread::id later_on;
  std::thread::id caller_id;
  std::thread caller([&] {
    caller_id = std::this_thread::get_id();
    mailbox.RunSync([&] { later_on = std::this_thread::get_id(); }, [&] { woke = true; });
  });
  caller.join();
  EXPECT_EQ(later_on, caller_id);
  EXPECT_FALSE(woke);
  EXPECT_EQ(runs, 1);  // the first function did not run again
}

TEST(Mailbox, ReopenedMailboxRunsOnTheOwnerAgain) {
  Mailbox mailbox;
  mailbox.Open();
  mailbox.Close();
  mailbox.Open();
  std::atomic<bool> posted{false};
  std::thread::id ran_on;
  std::thread poster([&] {
    mailbox.RunSync([&] { ran_on = std::this_thread::get_id(); },
                    [&] { posted.store(true, std::memory_order_seq_cst); });
  });
  Await([&] { return posted.load(std::memory_order_seq_cst); });
  EXPECT_TRUE(mailbox.pending());
  mailbox.RunPosted();
  poster.join();
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  mailbox.Close();
}

// Runs what was posted to the Mailbox `owner`, as a poller's wait duty does.
void ServeMailbox(void* owner) {
  Mailbox* mailbox = static_cast<Mailbox*>(owner);
  if (mailbox->pending()) mailbox->RunPosted();
}

// Thread A (with a wait duty for mailbox A) waits in RunSync on B's mailbox; B, before it gets to
// run its mailbox, waits in RunSync on A's. Without the duty neither would ever return; with it,
// A runs B's function while it waits, then B runs A's.
TEST(Mailbox, CallerWithAWaitDutyServesItWhileItWaits) {
  Mailbox a;
  Mailbox b;
  a.Open();
  b.Open();
  std::thread::id a_id;
  std::thread::id b_id;
  std::thread::id ran_for_b_on;  // B's function to A's mailbox
  std::thread::id ran_for_a_on;  // A's function to B's mailbox
  std::vector<char> order;       // guarded by the happens-before of the two RunSyncs
  std::atomic<bool> a_done{false};
  bool a_duty_during_wait = false;

  std::thread thread_b([&] {
    b_id = std::this_thread::get_id();
    EXPECT_FALSE(HasWaitDuty());
    a.RunSync(
        [&] {
          ran_for_b_on = std::this_thread::get_id();
          order.push_back('b');
        },
        [] {});
    // Only now does B serve its own mailbox, until A's call has returned.
    while (!a_done.load(std::memory_order_acquire)) {
      if (b.pending()) b.RunPosted();
      std::this_thread::yield();
    }
    b.Close();
  });
  std::thread thread_a([&] {
    a_id = std::this_thread::get_id();
    tls_wait_duty = {&ServeMailbox, &a};
    a_duty_during_wait = HasWaitDuty() && ServingAs(&a) && !ServingAs(&b);
    b.RunSync(
        [&] {
          ran_for_a_on = std::this_thread::get_id();
          order.push_back('a');
        },
        [] {});
    tls_wait_duty = {};
    a_done.store(true, std::memory_order_release);
    a.Close();
  });
  thread_a.join();
  thread_b.join();

  EXPECT_TRUE(a_duty_during_wait);
  EXPECT_EQ(ran_for_b_on, a_id);  // A served its mailbox while it waited
  EXPECT_EQ(ran_for_a_on, b_id);
  EXPECT_EQ(order, std::vector<char>({'b', 'a'}));
}

// A caller with a wait duty (here one with nothing to serve) still gets each function run on the
// owner, exactly once, and RunSync returns after it ran.
TEST(Mailbox, WaitDutyCallerGetsItsFunctionRunOnTheOwner) {
  OwnerThread owner;
  int runs = 0;
  std::thread::id ran_on;
  std::thread caller([&] {
    Mailbox idle;  // the caller's own mailbox: nobody posts to it
    tls_wait_duty = {&ServeMailbox, &idle};
    for (int i = 0; i < 50; ++i) {
      owner.RunSync([&] {
        ran_on = std::this_thread::get_id();
        ++runs;
      });
      EXPECT_EQ(runs, i + 1);
    }
    tls_wait_duty = {};
    EXPECT_FALSE(HasWaitDuty());
  });
  caller.join();
  EXPECT_EQ(runs, 50);
  EXPECT_EQ(ran_on, owner.id());
}

}  // namespace
}  // namespace cqd::internal
