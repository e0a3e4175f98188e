// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/device_claims.h"

#include <unordered_set>

#include "runtime/base/mutex.h"

namespace cqd::internal {
namespace {

struct Claims {
  Mutex mu;
  std::unordered_set<const void*> held CQD_GUARDED_BY(mu);
};

// Never destroyed: a runtime destroyed during static destruction still gives its claims back.
Claims& TheClaims() {
  static Claims* claims = new Claims;
  return *claims;
}

}  // namespace

bool DeviceClaim::Take(const void* native) {
  Claims& claims = TheClaims();
  MutexLock lock(claims.mu);
  if (!claims.held.insert(native).second) return false;
  native_ = native;
  return true;
}

DeviceClaim::~DeviceClaim() {
  if (native_ == nullptr) return;
  Claims& claims = TheClaims();
  MutexLock lock(claims.mu);
  claims.held.erase(native_);
}

}  // namespace cqd::internal
