// Must not build: a backend may not include the core.
#include "runtime/core/records.h"
