// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/options_check.h: RuntimeOptions checked before a runtime is made.
//
// Threading: any thread; reads only its argument (and the process's CPU affinity).
#ifndef CQD_RUNTIME_CORE_OPTIONS_CHECK_H_
#define CQD_RUNTIME_CORE_OPTIONS_CHECK_H_

#include "cqd/options.h"
#include "cqd/status.h"

namespace cqd::internal {

// Returns OK, kInvalidArgument naming the first bad option, or (every option within its bounds)
// kResourceExhausted if the consumers' lanes could not fit in the process's address space.
Status CheckOptions(const RuntimeOptions& options);

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_OPTIONS_CHECK_H_
