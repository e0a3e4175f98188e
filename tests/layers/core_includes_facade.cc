// SPDX-License-Identifier: BSD-2-Clause
// Must not build: the core may not include the facade's header.
#include "cqd/runtime.h"
