// PjrtRuntime: one PJRT_Client of a plugin, shared by ferry's client and every buffer made on it;
// plus the small helpers every PJRT call site needs (errors to Status, events to callbacks).
//
// Lifetimes. The ferry client, each of its buffers and nothing else hold a shared_ptr to the
// runtime; the last of them destroys the PJRT_Client, so PJRT buffers are always destroyed
// before their client, even when ferry buffers outlive the ferry client. Completion callbacks
// that run on the plugin's threads never hold the runtime: they hold a ClientLifetime::Token,
// which the ferry client's destructor waits for, and so the runtime is never released (and
// PJRT_Client_Destroy never called) on a plugin thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "ferry/core/status.h"
#include "fmt/format.h"
#include "src/device/client_lifetime.h"
#include "src/device/pjrt/pjrt_library.h"

namespace ferry::pjrt {

// The Status of a PJRT_Error (OK for null): its code and the plugin's message after `what`.
// Takes ownership of `error` and destroys it.
Status ErrorToStatus(const PJRT_Api& api, PJRT_Error* error, std::string_view what);

// Destroys `event` (null is fine).
void DestroyEvent(const PJRT_Api& api, PJRT_Event* event);

// Takes over `event` and runs `on_ready(status)` exactly once when it is ready: from the
// plugin's thread that completes it, or at once on this thread when it already is (or when the
// callback cannot be registered, with that error). Destroys the event afterwards.
void OnEventReady(const PJRT_Api& api, PJRT_Event* event,
                  absl::AnyInvocable<void(Status) &&> on_ready, std::string what);

// Takes over `event`, waits for it on this thread and destroys it; returns its status.
Status AwaitEvent(const PJRT_Api& api, PJRT_Event* event, std::string_view what);

// Whether `layout` is the row-major, untiled layout of a `rank`-dimensional buffer (minor_to_major
// rank-1, ..., 0 and no tiles): the one in which ferry's raw paths (byte offsets, host pointers)
// address a buffer's elements as a dense array.
bool IsRowMajorUntiled(const PJRT_Buffer_MemoryLayout& layout, size_t rank);

// The row-major, untiled layout of a `rank`-dimensional buffer, for ToHostBuffer's host_layout:
// without one the plugin writes the host buffer in the device's own layout (a TPU's tiles). Owns
// the array the layout points into, so it is neither copied nor moved.
class RowMajorLayout {
 public:
  explicit RowMajorLayout(size_t rank);
  RowMajorLayout(const RowMajorLayout&) = delete;
  RowMajorLayout& operator=(const RowMajorLayout&) = delete;

  PJRT_Buffer_MemoryLayout* get() { return &layout_; }

 private:
  std::vector<int64_t> minor_to_major_;
  PJRT_Buffer_MemoryLayout layout_;
};

class PjrtRuntime {
 public:
  PjrtRuntime(const PjrtLibrary& library, PJRT_Client* client)
      : library_(library), client_(client), lifetime_(std::make_shared<ClientLifetime>("pjrt")) {}
  // PJRT_Client_Destroy: only once every PJRT buffer of the client has been destroyed.
  ~PjrtRuntime();
  PjrtRuntime(const PjrtRuntime&) = delete;
  PjrtRuntime& operator=(const PjrtRuntime&) = delete;

  const PjrtLibrary& library() const { return library_; }
  const PJRT_Api& api() const { return *library_.api; }
  PJRT_Client* client() const { return client_; }
  const std::shared_ptr<ClientLifetime>& lifetime() const { return lifetime_; }

  Status Check(PJRT_Error* error, std::string_view what) const {
    return ErrorToStatus(api(), error, what);
  }
  // As above, with `what` formatted only when there is an error (calls made once per tensor).
  template <typename Arg, typename... Args>
  Status Check(PJRT_Error* error, fmt::format_string<Arg, Args...> what, Arg&& arg,
               Args&&... args) const {
    if (error == nullptr) return OkStatus();
    return ErrorToStatus(api(), error,
                         fmt::format(what, std::forward<Arg>(arg), std::forward<Args>(args)...));
  }

 private:
  const PjrtLibrary& library_;
  PJRT_Client* const client_;
  const std::shared_ptr<ClientLifetime> lifetime_;
};

// Zero-initialised PJRT argument struct with its struct_size set: `auto args = Args<X>();`.
template <typename ArgsStruct>
ArgsStruct Args(size_t struct_size) {
  ArgsStruct args{};
  args.struct_size = struct_size;
  return args;
}
#define FERRY_PJRT_ARGS(type) ::ferry::pjrt::Args<type>(type##_STRUCT_SIZE)

}  // namespace ferry::pjrt
