// SPDX-License-Identifier: BSD-2-Clause
// Strand (strand.h): queueing on the drain task, delivery on the strand task, and the ends.
#include "runtime/tbb/strand.h"

#include <chrono>
#include <thread>

namespace cqd::internal {

void StrandTeardownState::Finish(const Status& status) noexcept {
  {
    MutexLock lock(mu);
    result = status;
    finished = true;
  }
  done.store(true, std::memory_order_release);
  cv.NotifyAll();
  if (on_done) {
    try {
      on_done(status);
    } catch (...) {  // an on_done that throws: the result is already published
    }
  }
}

void StrandBatch::clear() {
  entries.clear();
  wcs.clear();
  events.clear();
  cms.clear();
  teardown_ends.clear();
}

void StrandBatch::swap(StrandBatch& other) noexcept {
  entries.swap(other.entries);
  wcs.swap(other.wcs);
  events.swap(other.events);
  cms.swap(other.cms);
  teardown_ends.swap(other.teardown_ends);
}

Strand::~Strand() {
  MutexLock lock(core->mu);
  core->live.erase(this);
}

template <typename Append>
bool Strand::Push(const Append& append) noexcept {
  bool schedule = false;
  bool rejected = false;
  {
    ScopedLock<SpinLock> lock(mu);
    if (!dead.load(std::memory_order_relaxed) && !core->stopped.load(std::memory_order_acquire)) {
      try {
        append(in_);
      } catch (const std::bad_alloc&) {  // dropped and counted: memory ran out
        lost.store(true, std::memory_order_release);
        core->orphans.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      if (!scheduled) {
        scheduled = true;
        schedule = true;
        keep_alive = shared_from_this();  // the registration holds one: this cannot throw
        core->inflight.fetch_add(1, std::memory_order_seq_cst);
      }
    } else {
      rejected = true;
    }
  }
  if (rejected) {
    Batch dropped;
    try {
      append(dropped);
    } catch (const std::bad_alloc&) {
    }
    Drop(dropped, 0, /*ends_too=*/false);
    return false;
  }
  if (schedule) Enqueue();
  return true;
}

void Strand::OnCompletions(std::span<const ibv_wc> wcs) noexcept {
  Push([&](Batch& b) {
    const auto first = static_cast<uint32_t>(b.wcs.size());
    const auto count = static_cast<uint32_t>(wcs.size());
    b.wcs.insert(b.wcs.end(), wcs.begin(), wcs.end());
    if (!b.entries.empty() && b.entries.back().kind == Kind::kCompletions &&
        b.entries.back().index + b.entries.back().count == first) {
      b.entries.back().count += count;  // adjacent runs: one call to the user handler
    } else {
      b.entries.push_back({Kind::kCompletions, first, count});
    }
  });
}
void Strand::OnAsyncEvent(const AsyncEvent& event) noexcept {
  Push([&](Batch& b) {
    b.events.push_back(event);
    b.entries.push_back({Kind::kAsync, static_cast<uint32_t>(b.events.size() - 1), 0});
  });
}
void Strand::OnCmEvent(const CmEvent& event) noexcept {
  Push([&](Batch& b) {
    b.cms.push_back(event);
    b.entries.push_back({Kind::kCm, static_cast<uint32_t>(b.cms.size() - 1), 0});
  });
}

void Strand::PushTeardownEnd(const std::shared_ptr<StrandTeardownState>& state,
                             const Status& status) noexcept {
  bool finish_now = false;
  Status result = status;
  {
    ScopedLock<SpinLock> lock(mu);
    if (!scheduled && in_.empty() && !dead.load(std::memory_order_relaxed) &&
        !core->stopped.load(std::memory_order_acquire)) {
      dead.store(true, std::memory_order_release);  // delivered up to here: nothing follows
      finish_now = true;
    }
  }
  if (!finish_now) {
    if (Push([&](Batch& b) {
          b.teardown_ends.push_back({state, status});
          b.entries.push_back(
              {Kind::kTeardownEnd, static_cast<uint32_t>(b.teardown_ends.size() - 1), 0});
        })) {
      return;
    }
    // Dead or stopped: nothing more is delivered. OK only if nothing was dropped.
    if (result.ok() && lost.load(std::memory_order_acquire)) {
      result =
          Cancelled("StrandConsumer: the strand dropped completions before the teardown's end");
    }
  }
  Leave();
  state->Finish(result);
}

void Strand::Enqueue() noexcept {
  if (EnqueueTask(*core->arena, [s = this] { s->Run(); })) return;
  core->enqueue_failures.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Strand> last;
  {
    ScopedLock<SpinLock> lock(mu);
    scheduled = false;  // the next push retries
    last = std::move(keep_alive);
  }
  core->inflight.fetch_sub(1, std::memory_order_release);
}

void Strand::Run() noexcept {
  bool requeued = false;
  std::shared_ptr<Strand> last;  // released after the inflight decrement
  {
    TaskScope scope(core.get(), this);
    core->strand_tasks.fetch_add(1, std::memory_order_relaxed);
    int items = 0;
    for (;;) {
      bool yield = false;
      {
        ScopedLock<SpinLock> lock(mu);
        if (in_.empty() || dead.load(std::memory_order_relaxed)) {
          scheduled = false;
          last = std::move(keep_alive);
          break;
        }
        if (items >= core->strand_budget) {
          yield = true;  // behind the arena's other tasks; `scheduled` stays set
        } else {
          out_.swap(in_);
          running.store(true, std::memory_order_release);
        }
      }
      if (yield) {
        if (RequeueSelf()) {
          requeued = true;  // the new task takes over this one's inflight count
          break;
        }
        items = 0;
        continue;
      }
      items += Deliver();
      out_.clear();
      ScopedLock<SpinLock> lock(mu);
      running.store(false, std::memory_order_release);
    }
  }
  if (!requeued) core->inflight.fetch_sub(1, std::memory_order_release);
}

bool Strand::RequeueSelf() noexcept {
  return EnqueueTask(*core->arena, [s = this] { s->Run(); });
}

int Strand::Deliver() noexcept {
  int n = 0;
  const size_t size = out_.entries.size();
  for (size_t i = 0; i < size; ++i) {
    if (dead.load(std::memory_order_acquire)) {
      Drop(out_, i, /*ends_too=*/true);
      return n;
    }
    const Entry& e = out_.entries[i];
    switch (e.kind) {
      case Kind::kCompletions:
        user->OnCompletions(std::span<const ibv_wc>(out_.wcs.data() + e.index, e.count));
        core->delivered.fetch_add(e.count, std::memory_order_relaxed);
        break;
      case Kind::kAsync:
        user->OnAsyncEvent(out_.events[e.index]);
        core->delivered.fetch_add(1, std::memory_order_relaxed);
        break;
      case Kind::kCm:
        user->OnCmEvent(out_.cms[e.index]);
        core->delivered.fetch_add(1, std::memory_order_relaxed);
        break;
      case Kind::kTeardownEnd: {
        // The runtime unregistered the QP before this: nothing follows. The handler made its
        // last call; the result goes out now.
        {
          ScopedLock<SpinLock> lock(mu);
          dead.store(true, std::memory_order_release);
        }
        Leave();
        out_.teardown_ends[e.index].state->Finish(out_.teardown_ends[e.index].status);
        break;
      }
    }
    ++n;
  }
  return n;
}

void Strand::Drop(Batch& b, size_t from, bool ends_too) noexcept {
  for (size_t i = from; i < b.entries.size(); ++i) {
    const Entry& e = b.entries[i];
    if (e.kind == Kind::kCompletions) {
      lost.store(true, std::memory_order_release);
      core->orphans.fetch_add(e.count, std::memory_order_relaxed);
      if (core->orphan_handler != nullptr) {
        core->orphan_handler->OnOrphans(std::span<const ibv_wc>(b.wcs.data() + e.index, e.count));
      }
    } else if (e.kind == Kind::kTeardownEnd) {
      if (ends_too) {
        Leave();
        b.teardown_ends[e.index].state->Finish(
            Cancelled("StrandConsumer: the strand was unregistered before the teardown's end"));
      }
    } else {
      core->dropped_events.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

void Strand::Leave() noexcept {
  MutexLock lock(core->mu);
  core->live.erase(this);
}

void Strand::Kill() noexcept {
  Batch leftovers;
  bool wait = false;
  {
    ScopedLock<SpinLock> lock(mu);
    dead.store(true, std::memory_order_release);
    leftovers.swap(in_);
    wait = running.load(std::memory_order_relaxed) && !TaskScope::InStrand(this);
  }
  Drop(leftovers, 0, /*ends_too=*/true);
  Leave();
  if (!wait) return;
  for (int spins = 0; running.load(std::memory_order_acquire); ++spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace cqd::internal
