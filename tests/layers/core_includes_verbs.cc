// SPDX-License-Identifier: BSD-2-Clause
// Must not build: the core may not include a backend.
#include "runtime/backend/verbs/verbs_device.h"
