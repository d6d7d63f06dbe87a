// PJRT_Events that ferry's plugin makes itself, next to the wrapped plugin's own.
//
// ferry's ToHostBuffer returns at once, with an event that completes when ferry's copy has: an
// event of ferry's own, since the wrapped plugin's API (0.81) has no entry to make one. A caller
// hands every PJRT_Event it gets to the table's five event entries and cannot tell whose it holds,
// so ferry's table replaces them: an event ferry made (recorded in a registry when it is made, as
// ferry's errors are: plugin_errors.h) is answered here, any other one is passed to the wrapped
// plugin untouched. ferry's events go only to callers, never into the wrapped plugin.
//
// Thread-safe: events may be made, awaited and destroyed on any thread. An OnReady callback runs
// on the thread that completes the event (one of ferry's copy workers), or at once on the
// registering thread when the event is complete. Destroying an event leaves its registered
// callbacks to run.
#pragma once

#include "ferry/core/future.h"
#include "pjrt_c_api.h"

namespace ferry::plugin {

// A new event that completes with `done` (its error, if any, becomes a PJRT_Error of ferry's).
// The caller owns it and frees it with the table's PJRT_Event_Destroy.
PJRT_Event* MakeEvent(Future<> done);

// The five entries of ferry's table. They forward events ferry did not make to `wrapped`
// (SetWrappedEventApi must have been called before any event reaches them).
void SetWrappedEventApi(const PJRT_Api* wrapped);
PJRT_Error* EventDestroy(PJRT_Event_Destroy_Args* args);
PJRT_Error* EventIsReady(PJRT_Event_IsReady_Args* args);
PJRT_Error* EventError(PJRT_Event_Error_Args* args);
PJRT_Error* EventAwait(PJRT_Event_Await_Args* args);
PJRT_Error* EventOnReady(PJRT_Event_OnReady_Args* args);

}  // namespace ferry::plugin
