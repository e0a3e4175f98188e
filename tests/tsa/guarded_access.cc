// SPDX-License-Identifier: BSD-2-Clause
// Builds under --config=tsa: every access to `count_` holds `mu_` (tools/check_tsa.sh).
#include "runtime/base/mutex.h"

namespace cqd::internal {

class Counter {
 public:
  void Add() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++count_;
  }
  int Read() CQD_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return count_;
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
