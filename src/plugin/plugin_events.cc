#include "src/plugin/plugin_events.h"

#include <atomic>
#include <utility>

#include "src/plugin/handle_registry.h"
#include "src/plugin/plugin_errors.h"

// The opaque type of the C API, defined by each plugin for its own events; ferry's are a different
// type behind the same name, told apart by the registry below, never by reading them.
struct FerryPluginEvent {
  ferry::Future<> done;
};

namespace ferry::plugin {
namespace {

std::atomic<const PJRT_Api*> wrapped_api{nullptr};

// The events ferry made and nobody has destroyed yet.
HandleRegistry& Registry() {
  static auto* registry = new HandleRegistry(internal::ForkLockRank::kPluginEvents);
  return *registry;
}

FerryPluginEvent* AsFerryEvent(PJRT_Event* event) {
  return event != nullptr && Registry().Contains(event) ? reinterpret_cast<FerryPluginEvent*>(event)
                                                        : nullptr;
}

// The caller's PJRT_Error for a completed event's status: null for OK.
PJRT_Error* ErrorOf(const Status& status) { return status.ok() ? nullptr : MakeError(status); }

// The wrapped plugin's `entry` (named `name` in the error when there is no wrapped plugin) for an
// event that is not ferry's.
template <typename Entry, typename Args>
PJRT_Error* Forward(Entry* PJRT_Api::*entry, Args* args, const char* name) {
  const PJRT_Api* wrapped = wrapped_api.load();
  if (wrapped == nullptr) {
    return MakeError(FailedPreconditionError(std::string(name) + ": no wrapped plugin"));
  }
  return (wrapped->*entry)(args);
}

}  // namespace

PJRT_Event* MakeEvent(Future<> done) {
  auto* event = new FerryPluginEvent{std::move(done)};
  Registry().Add(event);
  return reinterpret_cast<PJRT_Event*>(event);
}

void SetWrappedEventApi(const PJRT_Api* wrapped) { wrapped_api.store(wrapped); }

PJRT_Error* EventDestroy(PJRT_Event_Destroy_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Event_Destroy_Args);
  if (args->event == nullptr) return nullptr;
  if (Registry().Remove(args->event)) {
    // The callbacks registered on it hold the future's state: they still run.
    delete reinterpret_cast<FerryPluginEvent*>(args->event);
    return nullptr;
  }
  return Forward(&PJRT_Api::PJRT_Event_Destroy, args, "PJRT_Event_Destroy");
}

PJRT_Error* EventIsReady(PJRT_Event_IsReady_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Event_IsReady_Args);
  if (FerryPluginEvent* mine = AsFerryEvent(args->event)) {
    args->is_ready = mine->done.IsReady();
    return nullptr;
  }
  return Forward(&PJRT_Api::PJRT_Event_IsReady, args, "PJRT_Event_IsReady");
}

PJRT_Error* EventError(PJRT_Event_Error_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Event_Error_Args);
  if (FerryPluginEvent* mine = AsFerryEvent(args->event)) {
    if (!mine->done.IsReady()) {
      return MakeError(
          FailedPreconditionError("PJRT_Event_Error: the event has not completed (IsReady first)"));
    }
    return ErrorOf(mine->done.Await());
  }
  return Forward(&PJRT_Api::PJRT_Event_Error, args, "PJRT_Event_Error");
}

PJRT_Error* EventAwait(PJRT_Event_Await_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Event_Await_Args);
  if (FerryPluginEvent* mine = AsFerryEvent(args->event)) return ErrorOf(mine->done.Await());
  return Forward(&PJRT_Api::PJRT_Event_Await, args, "PJRT_Event_Await");
}

PJRT_Error* EventOnReady(PJRT_Event_OnReady_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Event_OnReady_Args);
  if (FerryPluginEvent* mine = AsFerryEvent(args->event)) {
    if (args->callback == nullptr) {
      return MakeError(InvalidArgumentError("PJRT_Event_OnReady: null callback"));
    }
    // The callback owns the error it is given (PJRT's rule), as with the wrapped plugin's events.
    mine->done.OnReady([callback = args->callback, user_arg = args->user_arg](
                           const Status& status) { callback(ErrorOf(status), user_arg); });
    return nullptr;
  }
  return Forward(&PJRT_Api::PJRT_Event_OnReady, args, "PJRT_Event_OnReady");
}

}  // namespace ferry::plugin
