// SPDX-License-Identifier: BSD-2-Clause
// Must build: each layer with what it may include (so that the other targets here fail for
// their include, not for a mistake of this package).
#include "cqd/types.h"
#include "runtime/backend/device.h"
#include "runtime/base/thread_role.h"
#include "runtime/core/shard/shard.h"
#include "runtime/observe/latency.h"
