// SPDX-License-Identifier: BSD-2-Clause
// runtime/core/device_claims.h: which native devices the runtimes of this process have added.
//
// A device's async events come from one fd per native device (the context's, or the simulated
// device's), and each read takes an event away from every other reader: two runtimes that both
// added one device would each see only some of its events (a QP's COMM_EST, a DEVICE_FATAL).
// So a native device belongs to one runtime at a time: Devices::AddDevice (control/devices.h) takes
// a claim on it, kept in the device's record, and the claim ends when that record is destroyed
// (with the runtime, or when the add failed). Two contexts of one device (two ibv_open_device
// calls, as OpenVerbsDevice makes) are two native devices: each reads its own QPs' events.
//
// Threading: any thread (control path only); the set of claims is guarded by a mutex.
#ifndef CQD_RUNTIME_CORE_DEVICE_CLAIMS_H_
#define CQD_RUNTIME_CORE_DEVICE_CLAIMS_H_

namespace cqd::internal {

class DeviceClaim {
 public:
  DeviceClaim() = default;
  ~DeviceClaim();  // gives the claim back, if one was taken
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;

  // Returns true and holds `native` if no claim holds it; false if another claim does.
  // At most one successful Take per DeviceClaim.
  bool Take(const void* native);

 private:
  const void* native_ = nullptr;
};

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_CORE_DEVICE_CLAIMS_H_
