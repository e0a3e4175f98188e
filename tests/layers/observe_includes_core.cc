// SPDX-License-Identifier: BSD-2-Clause
// Must not build: runtime/observe may not include the core.
#include "runtime/core/consumer.h"
