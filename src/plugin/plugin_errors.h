// PJRT_Errors that ferry's plugin makes itself, next to the wrapped plugin's own.
//
// A caller hands every PJRT_Error it gets back to the table's PJRT_Error_Message, _GetCode and
// _Destroy, and cannot tell whose error it holds. ferry's table therefore replaces those three
// entries: an error ferry made (recorded in a registry when it is made) is answered here, any
// other one is passed to the wrapped plugin untouched. The registry, rather than a tag inside the
// object, decides: ferry never reads memory behind a pointer the wrapped plugin owns.
//
// Thread-safe: errors may be made, read and destroyed on any thread.
#pragma once

#include "ferry/core/status.h"
#include "pjrt_c_api.h"

namespace ferry::plugin {

// A new PJRT_Error with `status`'s code and message (prefixed with "ferry_pjrt_plugin: "); the
// caller owns it and frees it with the table's PJRT_Error_Destroy. `status` must not be OK.
PJRT_Error* MakeError(const Status& status);

// Like ErrorToStatus in the pjrt backend, for an error that either ferry or the wrapped plugin
// made: its Status (OK for null); destroys the error.
Status TakeError(const PJRT_Api& wrapped, PJRT_Error* error);

// The three entries of ferry's table. They forward errors ferry did not make to `wrapped`
// (SetWrappedErrorApi must have been called before any error reaches them).
void SetWrappedErrorApi(const PJRT_Api* wrapped);
void DestroyError(PJRT_Error_Destroy_Args* args);
void ErrorMessage(PJRT_Error_Message_Args* args);
PJRT_Error* ErrorGetCode(PJRT_Error_GetCode_Args* args);

}  // namespace ferry::plugin
