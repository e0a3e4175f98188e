// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/base/pinning.h"

#include <pthread.h>
#include <sched.h>

namespace cqd::internal {

bool PinAndNameThread(int cpu, const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace cqd::internal
