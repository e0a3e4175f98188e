// Must not build: the core may not include a backend.
#include "runtime/backend/verbs/verbs_device.h"
