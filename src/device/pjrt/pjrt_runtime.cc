#include "src/device/pjrt/pjrt_runtime.h"

#include <utility>

#include "ferry/core/runtime_thread.h"
#include "fmt/format.h"
#include "src/core/tsan_hand_off.h"

namespace ferry::pjrt {
namespace {

absl::StatusCode ToStatusCode(PJRT_Error_Code code) {
  // PJRT's codes are abseil's, value for value.
  const int value = static_cast<int>(code);
  if (value < 0 || value > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(value);
}

struct ReadyCallback {
  const PJRT_Api* api;
  PJRT_Event* event;
  absl::AnyInvocable<void(Status) &&> on_ready;
  std::string what;
};

void RunReadyCallback(PJRT_Error* error, void* user_arg) {
  RuntimeThreadScope runtime_thread;  // a plugin's thread, running ferry's continuations
  TakeBackFromPlugin(user_arg);
  std::unique_ptr<ReadyCallback> callback(static_cast<ReadyCallback*>(user_arg));
  Status status = ErrorToStatus(*callback->api, error, callback->what);
  // The event is destroyed before the callback runs: what the callback releases may include the
  // last reference to whatever made the event.
  DestroyEvent(*callback->api, callback->event);
  std::move(callback->on_ready)(std::move(status));
}

}  // namespace

Status ErrorToStatus(const PJRT_Api& api, PJRT_Error* error, std::string_view what) {
  if (error == nullptr) return OkStatus();
  auto message = FERRY_PJRT_ARGS(PJRT_Error_Message_Args);
  message.error = error;
  api.PJRT_Error_Message(&message);
  auto get_code = FERRY_PJRT_ARGS(PJRT_Error_GetCode_Args);
  get_code.error = error;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  if (PJRT_Error* code_error = api.PJRT_Error_GetCode(&get_code); code_error == nullptr) {
    code = ToStatusCode(get_code.code);
  } else {
    auto destroy = FERRY_PJRT_ARGS(PJRT_Error_Destroy_Args);
    destroy.error = code_error;
    api.PJRT_Error_Destroy(&destroy);
  }
  Status status(
      code, fmt::format("{}: {}", what, std::string_view(message.message, message.message_size)));
  auto destroy = FERRY_PJRT_ARGS(PJRT_Error_Destroy_Args);
  destroy.error = error;
  api.PJRT_Error_Destroy(&destroy);
  return status;
}

bool IsRowMajorUntiled(const PJRT_Buffer_MemoryLayout& layout, size_t rank) {
  if (layout.type != PJRT_Buffer_MemoryLayout_Type_Tiled) return false;
  const PJRT_Buffer_MemoryLayout_Tiled& tiled = layout.tiled;
  if (tiled.num_tiles != 0 || tiled.minor_to_major_size != rank) return false;
  for (size_t i = 0; i < rank; ++i) {
    if (tiled.minor_to_major[i] != static_cast<int64_t>(rank - 1 - i)) return false;
  }
  return true;
}

RowMajorLayout::RowMajorLayout(size_t rank) : minor_to_major_(rank), layout_{} {
  for (size_t i = 0; i < rank; ++i) minor_to_major_[i] = static_cast<int64_t>(rank - 1 - i);
  layout_.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  layout_.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  layout_.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  layout_.tiled.minor_to_major = minor_to_major_.data();
  layout_.tiled.minor_to_major_size = rank;
}

void DestroyEvent(const PJRT_Api& api, PJRT_Event* event) {
  if (event == nullptr) return;
  auto args = FERRY_PJRT_ARGS(PJRT_Event_Destroy_Args);
  args.event = event;
  // A failure to free an event leaves nothing to do but report it: it is dropped.
  ErrorToStatus(api, api.PJRT_Event_Destroy(&args), "PJRT_Event_Destroy").IgnoreError();
}

void OnEventReady(const PJRT_Api& api, PJRT_Event* event,
                  absl::AnyInvocable<void(Status) &&> on_ready, std::string what) {
  if (event == nullptr) {
    std::move(on_ready)(OkStatus());
    return;
  }
  auto callback = std::make_unique<ReadyCallback>(
      ReadyCallback{&api, event, std::move(on_ready), std::move(what)});
  auto args = FERRY_PJRT_ARGS(PJRT_Event_OnReady_Args);
  args.event = event;
  args.callback = &RunReadyCallback;
  args.user_arg = callback.get();
  ReadyCallback* registered = callback.release();
  HandOffToPlugin(registered);
  if (PJRT_Error* error = api.PJRT_Event_OnReady(&args); error != nullptr) {
    // Not registered: the callback object is still ours.
    std::unique_ptr<ReadyCallback> unregistered(registered);
    Status status = ErrorToStatus(api, error, unregistered->what + " (PJRT_Event_OnReady)");
    DestroyEvent(api, unregistered->event);
    std::move(unregistered->on_ready)(std::move(status));
  }
}

Status AwaitEvent(const PJRT_Api& api, PJRT_Event* event, std::string_view what) {
  if (event == nullptr) return OkStatus();
  auto args = FERRY_PJRT_ARGS(PJRT_Event_Await_Args);
  args.event = event;
  Status status = ErrorToStatus(api, api.PJRT_Event_Await(&args), what);
  DestroyEvent(api, event);
  return status;
}

PjrtRuntime::~PjrtRuntime() {
  auto args = FERRY_PJRT_ARGS(PJRT_Client_Destroy_Args);
  args.client = client_;
  Check(api().PJRT_Client_Destroy(&args), "PJRT_Client_Destroy").IgnoreError();
}

}  // namespace ferry::pjrt
