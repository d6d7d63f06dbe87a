// PJRT_Client_BufferFromHostBuffer in ferry's plugin.
//
// Every argument is checked first (the XLA plugins crash on null dims, null data, an invalid or
// TOKEN element type, a byte_strides count other than num_dims, negative dims, no device and no
// memory): bad input returns INVALID_ARGUMENT naming the problem and never reaches the plugin.
//
// Then, per call:
// - ZeroCopy (immutable or mutable) of a dense, 64-byte-aligned, non-empty source: the wrapped
//   plugin's own entry, which aliases the caller's memory on a CPU plugin (nothing is faster than
//   no copy); done_with_host_buffer is the plugin's (it fires at PJRT_Buffer_Destroy).
// - otherwise, when the client's buffers are host memory (a "cpu" platform with
//   CreateViewOfDeviceBuffer) and the target is the device's default memory, with no device
//   layout asked for: ferry writes the source, with its own byte strides (transposed, sliced,
//   negative, zero), into memory from ferry's warm cache (AllocateHostMemory: memory that was
//   written before, not fresh pages), through CopyConvertPlan on the transfer engine's workers,
//   during the call; then hands the plugin a view of that memory (CreateViewOfDeviceBuffer, whose
//   on_delete gives the memory back to the cache). The buffer is the plugin's own. As ferry has
//   finished reading the source when the call returns, done_with_host_buffer is the new buffer's
//   ready event, which is already complete: a real PJRT_Event of the wrapped plugin that the
//   caller awaits, registers callbacks on and destroys as usual.
// - anything else (an element type ferry has no dtype for, a device layout, a non-default memory,
//   a plugin whose buffers are not host memory): the wrapped plugin's own entry, after the checks.
//
// Threading: any thread; the copy runs on the transfer engine's workers while the caller waits
// (it never waits for anything else, and ferry calls nothing back into the caller).
#pragma once

#include "pjrt_c_api.h"

namespace ferry::plugin {

PJRT_Error* BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args);

}  // namespace ferry::plugin
