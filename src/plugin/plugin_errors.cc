#include "src/plugin/plugin_errors.h"

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "src/device/pjrt/pjrt_runtime.h"
#include "src/plugin/handle_registry.h"

// The opaque type of the C API, defined by each plugin for its own errors; ferry's errors are a
// different type behind the same name, told apart by the registry below, never by reading them.
struct FerryPluginError {
  PJRT_Error_Code code;
  std::string message;
};

namespace ferry::plugin {
namespace {

std::atomic<const PJRT_Api*> wrapped_api{nullptr};
std::atomic<ErrorForEachPayloadEntry> wrapped_for_each_payload{nullptr};

// When ferry is built with a header that declares the entry, its slot must be the one above.
template <typename Api>
constexpr bool ForEachPayloadSlotAgrees() {
  if constexpr (requires(Api api) { api.PJRT_Error_ForEachPayload; }) {
    return offsetof(Api, PJRT_Error_ForEachPayload) == kErrorForEachPayloadOffset;
  } else {
    return true;
  }
}
static_assert(ForEachPayloadSlotAgrees<PJRT_Api>());

// The errors ferry made and nobody has destroyed yet.
HandleRegistry& Registry() {
  static auto* registry = new HandleRegistry(internal::ForkLockRank::kPluginErrors);
  return *registry;
}

FerryPluginError* AsFerryError(PJRT_Error* error) {
  return Registry().Contains(error) ? reinterpret_cast<FerryPluginError*>(error) : nullptr;
}

}  // namespace

PJRT_Error* MakeError(const Status& status) {
  // PJRT's codes are abseil's, value for value.
  auto* error = new FerryPluginError{static_cast<PJRT_Error_Code>(status.code()),
                                     "ferry_pjrt_plugin: " + std::string(status.message())};
  Registry().Add(error);
  return reinterpret_cast<PJRT_Error*>(error);
}

Status TakeError(const PJRT_Api& wrapped, PJRT_Error* error) {
  if (error == nullptr) return OkStatus();
  if (Registry().Remove(error)) {
    std::unique_ptr<FerryPluginError> mine(reinterpret_cast<FerryPluginError*>(error));
    return Status(static_cast<absl::StatusCode>(mine->code), mine->message);
  }
  return pjrt::ErrorToStatus(wrapped, error, "wrapped plugin");
}

void SetWrappedErrorApi(const PJRT_Api* wrapped) { wrapped_api.store(wrapped); }

void DestroyError(PJRT_Error_Destroy_Args* args) {
  // No error to return: a struct too small to hold `error` is left alone.
  if (args == nullptr || args->struct_size < PJRT_Error_Destroy_Args_STRUCT_SIZE) return;
  if (args->error == nullptr) return;
  if (Registry().Remove(args->error)) {
    delete reinterpret_cast<FerryPluginError*>(args->error);
    return;
  }
  if (const PJRT_Api* wrapped = wrapped_api.load()) wrapped->PJRT_Error_Destroy(args);
}

void ErrorMessage(PJRT_Error_Message_Args* args) {
  if (args == nullptr || args->struct_size < PJRT_Error_Message_Args_STRUCT_SIZE) return;
  // The message lives until the error is destroyed, as PJRT promises.
  if (FerryPluginError* mine = AsFerryError(const_cast<PJRT_Error*>(args->error))) {
    args->message = mine->message.data();
    args->message_size = mine->message.size();
    return;
  }
  if (const PJRT_Api* wrapped = wrapped_api.load()) wrapped->PJRT_Error_Message(args);
}

PJRT_Error* ErrorGetCode(PJRT_Error_GetCode_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Error_GetCode_Args);
  if (FerryPluginError* mine = AsFerryError(const_cast<PJRT_Error*>(args->error))) {
    args->code = mine->code;
    return nullptr;
  }
  if (const PJRT_Api* wrapped = wrapped_api.load()) return wrapped->PJRT_Error_GetCode(args);
  return MakeError(FailedPreconditionError("PJRT_Error_GetCode: no wrapped plugin"));
}

void SetWrappedForEachPayload(ErrorForEachPayloadEntry wrapped_entry) {
  wrapped_for_each_payload.store(wrapped_entry);
}

PJRT_Error* ErrorForEachPayload(ErrorForEachPayloadArgs* args) {
  if (PJRT_Error* refused =
          CheckArgs(args, "PJRT_Error_ForEachPayload_Args", sizeof(ErrorForEachPayloadArgs))) {
    return refused;
  }
  if (AsFerryError(args->error) != nullptr) return nullptr;  // no payloads
  if (ErrorForEachPayloadEntry wrapped = wrapped_for_each_payload.load()) return wrapped(args);
  return MakeError(FailedPreconditionError("PJRT_Error_ForEachPayload: no wrapped plugin"));
}

}  // namespace ferry::plugin
