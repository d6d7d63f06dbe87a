#include "src/plugin/version_bridge.h"

#include <algorithm>
#include <cstring>

#include "ferry/core/metrics.h"
#include "src/plugin/plugin_errors.h"
#include "src/plugin/wrapped_plugin.h"

namespace ferry::plugin {
namespace {

// The PJRT_ExecuteOptions size the wrapped plugin needs: its header's when that is ferry's minor
// or older (ferry's header knows it), else a generous size of zeros (plugins accept larger).
size_t ExecuteOptionsBytesFor(const PJRT_Api& wrapped) {
  if (wrapped.pjrt_api_version.major_version == PJRT_API_MAJOR &&
      wrapped.pjrt_api_version.minor_version <= PJRT_API_MINOR) {
    return PJRT_ExecuteOptions_STRUCT_SIZE;
  }
  return kExtendedOptionsBytes;
}

}  // namespace

PJRT_Error* ExecuteBridged(PJRT_LoadedExecutable_Execute_Args* args) {
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  const PJRT_Api& wrapped = (*plugin)->wrapped();
  // Too small a struct to hold `options`, or none given: the wrapped plugin's to answer.
  if (args == nullptr ||
      args->struct_size < PJRT_STRUCT_SIZE(PJRT_LoadedExecutable_Execute_Args, options) ||
      args->options == nullptr) {
    return wrapped.PJRT_LoadedExecutable_Execute(args);
  }
  const size_t needed = ExecuteOptionsBytesFor(wrapped);
  const size_t given = args->options->struct_size;
  if (given >= needed) return wrapped.PJRT_LoadedExecutable_Execute(args);
  // The caller's fields, then zeros: every field added since reads as "not given".
  alignas(alignof(std::max_align_t)) std::byte extended[std::max(
      kExtendedOptionsBytes, static_cast<size_t>(PJRT_ExecuteOptions_STRUCT_SIZE))] = {};
  std::memcpy(extended, args->options, given);
  auto* options = reinterpret_cast<PJRT_ExecuteOptions*>(extended);
  options->struct_size = needed;
  static Counter* const bridged = GetCounter("PjrtPluginBridgedExecuteOptions");
  bridged->Add();
  PJRT_ExecuteOptions* const callers = args->options;
  args->options = options;
  PJRT_Error* error = wrapped.PJRT_LoadedExecutable_Execute(args);
  args->options = callers;
  return error;
}

}  // namespace ferry::plugin
