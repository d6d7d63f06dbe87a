// PJRT_Buffer_ToHostBuffer in ferry's plugin.
//
// Checked first: null args or source buffer, a destination smaller than the buffer (the plugin
// would write past it). A size query (null dst) and every case below that ferry does not take go
// to the wrapped plugin unchanged.
//
// ferry reads the buffer itself when the buffer is in host memory (PJRT_Buffer_IsOnCpu), has an
// element type ferry knows, a row-major untiled layout, and the host_layout asked for is none or
// that same row-major untiled one (torch_xla's `.cpu()` always passes it): then, once the buffer
// is ready (a buffer still being computed, such as an Execute's output, is waited for in the
// call), the copy runs through CopyConvertPlan on the transfer engine's workers during the call,
// under an external reference on the buffer (as DLPack and numpy hold one: the memory stays put
// and alive whatever another thread does to the buffer), and the returned event is the buffer's
// (complete) ready event. A buffer whose computation failed goes to the plugin, which reports
// the error in its event; another host layout too.
//
// Threading: any thread; the caller waits for the engine's workers during the copy.
#pragma once

#include "pjrt_c_api.h"

namespace ferry::plugin {

PJRT_Error* ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args);

}  // namespace ferry::plugin
