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
//   and hands the plugin a view of that memory (CreateViewOfDeviceBuffer, whose on_delete gives
//   the memory back to the cache). The buffer is the plugin's own. When:
//   - the caller keeps the source until done_with_host_buffer (every semantic but
//     kImmutableOnlyDuringCall), the source is larger than kInlineWriteBytes and the plugin makes
//     pending buffers (PJRT_Client_CreateAliasBuffer, API 0.76 on): the call returns at once
//     with a pending buffer of the plugin's, which ferry fulfils (PJRT_Client_FulfillAliasBuffer)
//     with the view once its workers have written the source, or with the error that stopped
//     them. Until then the buffer is not ready: the plugin orders computations after it, and its
//     memory does not exist yet (a read of it waits for the write in the plugin). The caller's
//     callbacks on the buffer run on ferry's fulfilment thread (WrappedPlugin::fulfilments).
//     done_with_host_buffer is an event of ferry's own (plugin_events.h), complete once the
//     source has been read. A plugin that refuses pending buffers (UNIMPLEMENTED) is not asked
//     again; another refusal falls back, for that call, to the path below.
//   - otherwise the write runs during the call; as ferry has finished reading the source when the
//     call returns, done_with_host_buffer is the new buffer's ready event, which is already
//     complete: a real PJRT_Event of the wrapped plugin.
// - anything else (an element type ferry has no dtype for, a device layout, a non-default memory,
//   a plugin whose buffers are not host memory): the wrapped plugin's own entry, after the checks.
//
// Threading: any thread. A copy during the call runs on the transfer engine's workers while the
// caller waits (it never waits for anything else); a copy after the call runs on them while the
// caller goes on. ferry calls nothing back into the caller but the callbacks the caller
// registered on the events it was given.
#pragma once

#include "pjrt_c_api.h"

namespace ferry::plugin {

PJRT_Error* BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args);

}  // namespace ferry::plugin
