// SPDX-License-Identifier: BSD-2-Clause
// Must not build: a backend may not include the core.
#include "runtime/core/records.h"
