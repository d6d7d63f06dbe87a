// Bridging PJRT C API minor versions in ferry's plugin (docs/pjrt.md, "Frameworks built against
// another PJRT version").
//
// A plugin requires every argument struct to be at least its own size (XLA's
// ActualStructSizeIsGreaterOrEqual: "Unexpected <struct> size: expected E, got A"), and PJRT grows
// structs by appending fields that read as absent when zero. So a framework built against an
// older header than the wrapped plugin's is refused where one of its structs grew since; ferry's
// plugin passes the wrapped plugin a copy of the caller's struct extended with zeros instead,
// and gives back what the caller's size holds. Decided per entry from the header's history, not
// generically (nested structs grow while the outer args keep their size):
//
//   0.75 -> 0.81 (torch_xla 2.9 on the XLA CPU plugin):
//   - PJRT_LoadedExecutable_Execute: Execute_Args is 80 bytes in both, but its nested
//     PJRT_ExecuteOptions grew from 80 to 112 bytes (call_location in 0.76; num_tasks, task_ids,
//     incarnation_ids in 0.78), all inputs whose zero means "not given". Bridged: the options are
//     copied zero-extended for the call; nothing is copied back (outputs go to caller-owned
//     arrays). For a wrapped plugin newer than ferry's header (0.97 appended multi_slice_config,
//     a size ferry cannot know), the copy is kExtendedOptionsBytes of zeros past the caller's
//     fields: plugins accept a larger struct.
//   - PJRT_Client_UpdateGlobalProcessInfo: PJRT_ProcessInfo gained struct_size at offset 0 (an
//     insertion, not an append), and the args do not say which layout the caller used: not
//     bridged (the XLA CPU plugin does not implement the entry; torch_xla 2.9 never calls it).
//   - every other argument struct has the same size in 0.75 and 0.81.
//
//   A newer framework on an older plugin: its larger structs are accepted as they are and their
//   newer fields ignored; ferry's table keeps the wrapped plugin's version and entries (never
//   adding one), so the framework sees what the plugin can do.
//
// Threading: any thread, as the entries it stands for.
#pragma once

#include <cstddef>

#include "pjrt_c_api.h"

namespace ferry::plugin {

// The size a bridged PJRT_ExecuteOptions copy is given when the wrapped plugin is newer than
// ferry's header.
inline constexpr size_t kExtendedOptionsBytes = 256;

// PJRT_LoadedExecutable_Execute with the caller's PJRT_ExecuteOptions zero-extended to what the
// wrapped plugin needs.
PJRT_Error* ExecuteBridged(PJRT_LoadedExecutable_Execute_Args* args);

}  // namespace ferry::plugin
