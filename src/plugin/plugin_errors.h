// PJRT_Errors that ferry's plugin makes itself, next to the wrapped plugin's own.
//
// A caller hands every PJRT_Error it gets back to the table's PJRT_Error_Message, _GetCode,
// _Destroy and (API 0.9x on) _ForEachPayload, and cannot tell whose error it holds. ferry's table
// therefore replaces those entries: an error ferry made (recorded in a registry when it is made) is
// answered here, any other one is passed to the wrapped plugin untouched. The registry, rather than
// a tag inside the object, decides: ferry never reads memory behind a pointer the wrapped plugin
// owns.
//
// Thread-safe: errors may be made, read and destroyed on any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "ferry/core/status.h"
#include "fmt/format.h"
#include "pjrt_c_api.h"

namespace ferry::plugin {

// A new PJRT_Error with `status`'s code and message (prefixed with "ferry_pjrt_plugin: "); the
// caller owns it and frees it with the table's PJRT_Error_Destroy. `status` must not be OK.
PJRT_Error* MakeError(const Status& status);

// Null when the caller's args struct is there and holds this header's struct up to `needed`
// bytes (its STRUCT_SIZE: every field ferry reads or writes), else an INVALID_ARGUMENT error
// worded as the XLA plugins word it. Each of ferry's own entries checks first, so that it never
// reads or writes past a caller's struct (the wrapped plugin refuses such a call the same way).
template <typename Args>
PJRT_Error* CheckArgs(const Args* args, std::string_view struct_name, size_t needed) {
  if (args == nullptr)
    return MakeError(InvalidArgumentError(fmt::format("{}: null args", struct_name)));
  if (args->struct_size >= needed) return nullptr;
  return MakeError(InvalidArgumentError(fmt::format("Unexpected {} size: expected {}, got {}",
                                                    struct_name, needed, args->struct_size)));
}
#define FERRY_CHECK_PLUGIN_ARGS(args, Type)                                                \
  if (PJRT_Error* refused = ::ferry::plugin::CheckArgs(args, #Type, Type##_STRUCT_SIZE)) { \
    return refused;                                                                        \
  }

// Like ErrorToStatus in the pjrt backend, for an error that either ferry or the wrapped plugin
// made: its Status (OK for null); destroys the error.
Status TakeError(const PJRT_Api& wrapped, PJRT_Error* error);

// Three of those entries of ferry's table. They forward errors ferry did not make to `wrapped`
// (SetWrappedErrorApi must have been called before any error reaches them).
void SetWrappedErrorApi(const PJRT_Api* wrapped);
void DestroyError(PJRT_Error_Destroy_Args* args);
void ErrorMessage(PJRT_Error_Message_Args* args);
PJRT_Error* ErrorGetCode(PJRT_Error_GetCode_Args* args);

// PJRT_Error_ForEachPayload, the fourth entry that takes an error: added to the C API after the
// header ferry is built with (0.81), so declared here as the newer header declares it. Its slot
// is at byte 1096 of the PJRT_Api table (entries are only ever appended since 0.57, so a table
// of more than 1096 + 8 bytes has it there: JAX 0.10 calls it on every error it gets from a table
// that long). ferry's errors carry no payloads: the call visits nothing; any other error goes to
// the wrapped plugin's entry.
struct ErrorForEachPayloadArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
  void (*visitor)(const char* key, size_t key_size, const char* value, size_t value_size,
                  void* user_arg);
  void* user_arg;
};
using ErrorForEachPayloadEntry = PJRT_Error* (*)(ErrorForEachPayloadArgs*);
inline constexpr size_t kErrorForEachPayloadOffset = 1096;
// `wrapped_entry`: the wrapped table's own entry in that slot.
void SetWrappedForEachPayload(ErrorForEachPayloadEntry wrapped_entry);
PJRT_Error* ErrorForEachPayload(ErrorForEachPayloadArgs* args);

}  // namespace ferry::plugin
