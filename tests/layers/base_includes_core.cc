// Must not build: runtime/base may not include the core.
#include "runtime/core/poller.h"
