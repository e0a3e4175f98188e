// SPDX-License-Identifier: BSD-2-Clause
// Must not build: runtime/base may not include the core.
#include "runtime/core/shard/shard.h"
