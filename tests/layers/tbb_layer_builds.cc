// SPDX-License-Identifier: BSD-2-Clause
// Must build: the oneTBB layer with what it may include (the public headers), so that the
// tbb_includes_* targets fail for their include, not for a mistake of this package.
#include "cqd/runtime.h"
#include "cqd/tbb.h"
