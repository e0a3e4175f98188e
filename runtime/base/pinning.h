// SPDX-License-Identifier: BSD-2-Clause
// runtime/base/pinning.h: places and names the runtime's threads.
//
// Threading: each thread calls it for itself, once, as it starts.
#ifndef CQD_RUNTIME_BASE_PINNING_H_
#define CQD_RUNTIME_BASE_PINNING_H_

#include <string>

namespace cqd::internal {

// Names the calling thread (the first 15 bytes of `name`) and pins it to `cpu` if `cpu` >= 0.
// Returns false if pinning failed (the thread then runs where the scheduler puts it).
bool PinAndNameThread(int cpu, const std::string& name);

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_BASE_PINNING_H_
