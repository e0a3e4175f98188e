// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/types.h: the small identifiers the runtime hands out, shared by every public header.
///
/// Plain values: any thread may copy and compare them.
#ifndef CQD_TYPES_H_
#define CQD_TYPES_H_

#include <cstdint>

#include "cqd/version.h"

namespace cqd {

/// A device added to a Runtime (AddVerbsDevice, OpenVerbsDevice, AddSimDevice): 1, 2, ... in the
/// order they were added; 0 names none.
using DeviceId = uint32_t;

/// An index into RuntimeOptions::consumers.
using ConsumerId = uint32_t;

}  // namespace cqd

#endif  // CQD_TYPES_H_
