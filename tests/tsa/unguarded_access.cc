// SPDX-License-Identifier: BSD-2-Clause
// Must FAIL under --config=tsa: Read takes no lock (tools/check_tsa.sh).
#include "runtime/base/mutex.h"

namespace cqd::internal {

class Counter {
 public:
  void Add() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++count_;
  }
  int Read() CQD_EXCLUDES(mu_) {
    return count_;  // guarded_access.cc holds a MutexLock here
  }

 private:
  Mutex mu_;
  int count_ CQD_GUARDED_BY(mu_) = 0;
};

int UseCounter() {
  Counter counter;
  counter.Add();
  return counter.Read();
}

}  // namespace cqd::internal
