// PJRT_Buffer_ToHostBuffer in ferry's plugin.
//
// Checked first: null args or source buffer, a destination smaller than the buffer (the plugin
// would write past it). A size query (null dst) and every case below that ferry does not take go
// to the wrapped plugin unchanged.
//
// ferry reads the buffer itself when the buffer is in host memory (PJRT_Buffer_IsOnCpu), has an
// element type ferry knows, a row-major untiled layout, and the host_layout asked for is none or
// that same row-major untiled one (torch_xla's `.cpu()` always passes it). The copy runs through
// CopyConvertPlan under an external reference on the buffer (as DLPack and numpy hold one: the
// memory stays put and alive whatever another thread does to the buffer), and the returned event
// is ferry's own (plugin_events.h): a ready buffer is copied on the transfer engine's workers
// during the call; a buffer not complete yet (an Execute's output still being computed, a transfer
// manager's buffer, a pending buffer of PJRT_Client_CreateAliasBuffer that the caller fulfils
// after this call) is never waited for: the call returns at once, and once the plugin completes
// the buffer its read starts on the fulfilment thread (ferry's copy, or the plugin's read for a
// failed buffer, whose error is then the event's). ferry takes an external reference on complete
// buffers only: the CPU plugin's waits for memory not there yet, and aborts on failed memory. A
// buffer that ferry's own put returned before writing it (host_to_device.h) has no memory until
// ferry has written it and the plugin has it fulfilled: its read is checked during the call (the
// destination's size) and started on the fulfilment thread once that is done
// (WrappedPlugin::PendingPut), so the call does not wait for the write either. Another host layout
// goes to the plugin.
//
// Threading: any thread; the caller waits for the engine's workers during a copy in the call.
#pragma once

#include "pjrt_c_api.h"

namespace ferry::plugin {

PJRT_Error* ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args);

// ferry's PJRT_Buffer_Destroy: the wrapped plugin's, deferred while ferry's reads still use the
// buffer (WrappedPlugin::BeginUse), as PJRT lets a caller destroy a buffer with reads in flight.
PJRT_Error* BufferDestroy(PJRT_Buffer_Destroy_Args* args);

}  // namespace ferry::plugin
