#include "src/plugin/device_to_host.h"

#include <cstdint>
#include <optional>
#include <utility>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_view.h"
#include "fmt/format.h"
#include "src/core/tsan_hand_off.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/transfer_engine.h"
#include "src/plugin/plugin_errors.h"
#include "src/plugin/plugin_events.h"
#include "src/plugin/plugin_types.h"
#include "src/plugin/wrapped_plugin.h"

namespace ferry::plugin {
namespace {

// What ferry needs to read a buffer itself.
struct ReadableBuffer {
  const std::byte* data = nullptr;
  DType dtype = DType::kF32;
  Dims dims;
};

// Lets go of the external reference Readable took, and ends that use of the caller's handle
// (which destroys it if the caller destroyed it meanwhile: WrappedPlugin::BeginUse).
void ReleaseHold(WrappedPlugin& plugin, PJRT_Buffer* buffer) {
  const PJRT_Api& api = plugin.wrapped();
  auto release = FERRY_PJRT_ARGS(PJRT_Buffer_DecreaseExternalReferenceCount_Args);
  release.buffer = buffer;
  TakeError(api, api.PJRT_Buffer_DecreaseExternalReferenceCount(&release)).IgnoreError();
  plugin.EndUse(buffer);
}

// The buffer's element type and dims, where ferry knows the type; nullopt else.
std::optional<std::pair<DType, Dims>> KnownTypeAndDims(const PJRT_Api& api, PJRT_Buffer* buffer) {
  auto type = FERRY_PJRT_ARGS(PJRT_Buffer_ElementType_Args);
  type.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_ElementType(&type)).ok()) return std::nullopt;
  const std::optional<DType> dtype = FromPjrtType(type.type);
  if (!dtype.has_value()) return std::nullopt;
  auto dims = FERRY_PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  dims.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_Dimensions(&dims)).ok()) return std::nullopt;
  return std::make_pair(*dtype, Dims(dims.dims, dims.dims + dims.num_dims));
}

// A destination of `dst_size` bytes holds a buffer of `size_bytes`; else InvalidArgument,
// counted as refused.
Status CheckDestinationSize(size_t dst_size, int64_t size_bytes) {
  if (dst_size >= static_cast<size_t>(size_bytes)) return OkStatus();
  CountTransferPath(TransferPath::kRefused);
  return InvalidArgumentError(fmt::format(
      "ToHostBuffer: dst_size {} is smaller than the buffer's {} bytes", dst_size, size_bytes));
}

// The plugin's ready event of `buffer` (the caller owns it); null where it cannot be had.
PJRT_Event* ReadyEvent(const PJRT_Api& api, PJRT_Buffer* buffer) {
  auto ready = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_ReadyEvent(&ready)).ok()) return nullptr;
  return ready.event;
}

// Where a buffer stands: complete (its memory there), failed, or not complete yet (an Execute's
// output being computed, a pending buffer not fulfilled yet, whose memory may not exist).
enum class Completion { kComplete, kFailed, kPending };

// `buffer`'s completion, asked once (one ready event); for a pending buffer with `until` given,
// a future there that completes when the plugin completes the buffer (with or without an error).
// A buffer whose readiness cannot be asked counts as failed (the plugin reads it).
Completion CompletionOf(const PJRT_Api& api, PJRT_Buffer* buffer, std::optional<Future<>>* until) {
  PJRT_Event* ready = ReadyEvent(api, buffer);
  if (ready == nullptr) return Completion::kFailed;
  auto is_ready = FERRY_PJRT_ARGS(PJRT_Event_IsReady_Args);
  is_ready.event = ready;
  if (!TakeError(api, api.PJRT_Event_IsReady(&is_ready)).ok()) {
    pjrt::DestroyEvent(api, ready);
    return Completion::kFailed;
  }
  if (is_ready.is_ready) {
    auto error = FERRY_PJRT_ARGS(PJRT_Event_Error_Args);
    error.event = ready;
    const bool ok = TakeError(api, api.PJRT_Event_Error(&error)).ok();
    pjrt::DestroyEvent(api, ready);
    return ok ? Completion::kComplete : Completion::kFailed;
  }
  if (until == nullptr) {
    pjrt::DestroyEvent(api, ready);
    return Completion::kPending;
  }
  Promise<> complete;
  pjrt::OnEventReady(
      api, ready, [complete](Status status) { complete.Set(std::move(status)); },
      "the buffer to read");
  *until = complete.future();
  return Completion::kPending;
}

// The buffer's memory when ferry may read it itself, with an external reference held on it (the
// caller releases it with ReleaseHold); nullopt (and no reference) when the plugin should read,
// or, with `until_complete` given, when the buffer is one ferry could read but is not complete
// yet: that future is then set, completing when the plugin completes the buffer.
std::optional<ReadableBuffer> Readable(WrappedPlugin& plugin, PJRT_Buffer* buffer,
                                       std::optional<Future<>>* until_complete = nullptr) {
  const pjrt::PjrtLibrary& library = plugin.library();
  if (!FERRY_PJRT_HAS(library, PJRT_Buffer_IsOnCpu) ||
      !FERRY_PJRT_HAS(library, PJRT_Buffer_GetMemoryLayout) ||
      !FERRY_PJRT_HAS(library, PJRT_Buffer_OpaqueDeviceMemoryDataPointer) ||
      !FERRY_PJRT_HAS(library, PJRT_Event_IsReady) || !FERRY_PJRT_HAS(library, PJRT_Event_Error)) {
    return std::nullopt;
  }
  if (!FERRY_PJRT_HAS(library, PJRT_Buffer_IncreaseExternalReferenceCount) ||
      !FERRY_PJRT_HAS(library, PJRT_Buffer_DecreaseExternalReferenceCount)) {
    return std::nullopt;
  }
  const PJRT_Api& api = plugin.wrapped();
  auto on_cpu = FERRY_PJRT_ARGS(PJRT_Buffer_IsOnCpu_Args);
  on_cpu.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_IsOnCpu(&on_cpu)).ok() || !on_cpu.is_on_cpu) {
    return std::nullopt;
  }
  std::optional<std::pair<DType, Dims>> shape = KnownTypeAndDims(api, buffer);
  if (!shape.has_value()) return std::nullopt;
  auto layout = FERRY_PJRT_ARGS(PJRT_Buffer_GetMemoryLayout_Args);
  layout.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_GetMemoryLayout(&layout)).ok() ||
      !pjrt::IsRowMajorUntiled(layout.layout, shape->second.size())) {
    return std::nullopt;
  }
  // Only a complete buffer's memory is taken: for a buffer whose memory is not there yet (a
  // pending buffer the caller fulfils later) the CPU plugin's IncreaseExternalReferenceCount waits
  // until it is, and for one whose memory failed it aborts the process.
  if (CompletionOf(api, buffer, until_complete) != Completion::kComplete) return std::nullopt;
  // The external reference keeps the memory where it is, and alive, while ferry reads it (as it
  // does for DLPack or numpy), whatever another thread does to the buffer meanwhile; it lives in
  // the caller's handle, whose PJRT_Buffer_Destroy ferry defers until the read is over (BeginUse).
  auto hold = FERRY_PJRT_ARGS(PJRT_Buffer_IncreaseExternalReferenceCount_Args);
  hold.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_IncreaseExternalReferenceCount(&hold)).ok()) {
    return std::nullopt;
  }
  plugin.BeginUse(buffer);
  auto pointer = FERRY_PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
  pointer.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&pointer)).ok()) {
    ReleaseHold(plugin, buffer);
    return std::nullopt;
  }
  // Written by ferry's workers after a put that returned before them (host_to_device.cc), and
  // ordered before this read by the plugin's events, which TSan cannot see.
  TakeBackFromPlugin(pointer.device_memory_ptr);
  return ReadableBuffer{static_cast<const std::byte*>(pointer.device_memory_ptr), shape->first,
                        std::move(shape->second)};
}

PJRT_Error* ByPlugin(const PJRT_Api& api, PJRT_Buffer_ToHostBuffer_Args* args) {
  CountTransferPath(TransferPath::kReadByPlugin);
  return api.PJRT_Buffer_ToHostBuffer(args);
}

// The copy of `plan` (`size_bytes`) after the call that started it: inline when small, else on
// ferry's workers; then lets go of the buffer's external reference and completes `copied`. Never
// waits.
void CopyAfterCall(WrappedPlugin* plugin, PJRT_Buffer* buffer, CopyConvertPlan plan,
                   int64_t size_bytes, Promise<> copied) {
  Status done;
  if (size_bytes > kInlineWriteBytes) {
    StatusOr<Future<>> submitted =
        WriteThroughEngine(plugin->engine(), std::move(plan),
                           HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, nullptr);
    if (submitted.ok()) {
      submitted->OnReady([plugin, buffer, copied](const Status& status) {
        ReleaseHold(*plugin, buffer);
        copied.Set(status);
      });
      return;
    }
    done = submitted.status();
  } else if (size_bytes > 0) {
    plan.CopyAll();
  }
  ReleaseHold(*plugin, buffer);
  copied.Set(std::move(done));
}

// ferry's read of `source` (complete, held by an external reference, which this takes over: see
// Readable) into `dst`: the copy's future, or an error. `copy_in_call` true: copied during the
// call; false: after it (for a thread that must not wait for the workers).
StatusOr<Future<>> StartHeldRead(WrappedPlugin& plugin, const ReadableBuffer& source,
                                 PJRT_Buffer* buffer, void* dst, size_t dst_size,
                                 bool copy_in_call) {
  const HostView src = HostView::Dense(source.data, source.dtype, source.dims);
  const int64_t size_bytes = src.dense_size_bytes();
  if (Status fits = CheckDestinationSize(dst_size, size_bytes); !fits.ok()) {
    ReleaseHold(plugin, buffer);
    return fits;
  }
  StatusOr<CopyConvertPlan> plan =
      CopyConvertPlan::Create(src, MutableHostView::Dense(dst, source.dtype, source.dims));
  if (!plan.ok()) {
    ReleaseHold(plugin, buffer);
    return plan.status();
  }
  CountTransferPath(TransferPath::kReadByFerry);
  if (copy_in_call) {
    // The usual read: copied during the call on every core, as the plugin would. Measured with
    // torch_xla's `.cpu()`, a copy left to run after the call returns is slower here, its workers
    // competing with the caller's own threads for the two cores.
    StatusOr<Future<>> copied =
        size_bytes == 0
            ? StatusOr<Future<>>(Future<>::Ready(OkStatus()))
            : WriteThroughEngine(plugin.engine(), *std::move(plan),
                                 HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, nullptr);
    ReleaseHold(plugin, buffer);
    return copied;
  }
  Promise<> copied;
  CopyAfterCall(&plugin, buffer, *std::move(plan), size_bytes, copied);
  return copied.future();
}

// The read of args->src into args->dst (`args` a copy of the caller's, without its pointers into
// the caller's memory: host_layout and extension_start null), in the row-major host layout when
// `row_major_host_layout` (the caller asked for it), else in the buffer's own, by ferry where it
// can read the buffer (complete, not failed), else by the plugin (which reports a failed buffer's
// error): its future. For a read that waited for the buffer to complete (ReadOnceComplete); runs
// on the fulfilment thread, which it never holds up with the copy.
Future<> ReadNow(WrappedPlugin& plugin, PJRT_Buffer_ToHostBuffer_Args args,
                 bool row_major_host_layout) {
  const PJRT_Api& api = plugin.wrapped();
  // ferry reads only row-major buffers (Readable), which is both layouts at once.
  if (std::optional<ReadableBuffer> source = Readable(plugin, args.src); source.has_value()) {
    StatusOr<Future<>> started =
        StartHeldRead(plugin, *source, args.src, args.dst, args.dst_size, /*copy_in_call=*/false);
    return started.ok() ? *std::move(started) : Future<>::Ready(started.status());
  }
  // The plugin's read: where the address now holds another buffer than ferry's pending one (it
  // was destroyed, and the plugin reused the address), its layout may not be row-major, and the
  // row-major layout the caller asked for is asked again (the caller's own struct is gone).
  std::optional<pjrt::RowMajorLayout> row_major;
  if (row_major_host_layout) {
    std::optional<std::pair<DType, Dims>> shape = KnownTypeAndDims(api, args.src);
    if (!shape.has_value()) {
      return Future<>::Ready(
          InternalError("ToHostBuffer: the buffer's element type or dims cannot be read"));
    }
    row_major.emplace(shape->second.size());
    args.host_layout = row_major->get();
  }
  if (Status called = TakeError(api, ByPlugin(api, &args)); !called.ok()) {
    return Future<>::Ready(std::move(called));
  }
  Promise<> read;
  pjrt::OnEventReady(
      api, args.event, [read](Status status) { read.Set(std::move(status)); }, "ToHostBuffer");
  return read.future();
}

// A read of a buffer not complete yet, `complete` completing when it is: one that ferry's put
// returned before writing (its fulfilment), or any the plugin has not completed (an Execute's
// output still being computed, a pending buffer the caller fulfils later): planned and checked
// now, started on the fulfilment thread once the buffer is complete, and the call returns at once
// with ferry's event. Nullopt, with nothing done, where it cannot be planned now
// (a host layout other than the buffer's own row-major one, an element type ferry does not know):
// the caller then reads as for any buffer.
std::optional<PJRT_Error*> ReadOnceComplete(WrappedPlugin& plugin, const Future<>& complete,
                                            PJRT_Buffer_ToHostBuffer_Args* args) {
  std::optional<std::pair<DType, Dims>> shape = KnownTypeAndDims(plugin.wrapped(), args->src);
  if (!shape.has_value() || (args->host_layout != nullptr &&
                             !pjrt::IsRowMajorUntiled(*args->host_layout, shape->second.size()))) {
    return std::nullopt;
  }
  const int64_t size_bytes =
      HostView::Dense(nullptr, shape->first, shape->second).dense_size_bytes();
  if (Status fits = CheckDestinationSize(args->dst_size, size_bytes); !fits.ok()) {
    return MakeError(fits);
  }
  Promise<> read;
  args->event = MakeEvent(read.future());
  // The read uses the caller's handle after the call returns: a Destroy meanwhile waits for it.
  plugin.BeginUse(args->src);
  // What the read needs later, without pointers into the caller's memory (gone once it returns).
  PJRT_Buffer_ToHostBuffer_Args later = *args;
  const bool row_major_host_layout = later.host_layout != nullptr;  // checked row-major above
  later.host_layout = nullptr;
  later.extension_start = nullptr;
  complete.OnReady(plugin.fulfilments(),
                   [plugin = &plugin, later, row_major_host_layout, read](const Status&) mutable {
                     ReadNow(*plugin, later, row_major_host_layout)
                         .OnReady([plugin, buffer = later.src, read](const Status& status) {
                           plugin->EndUse(buffer);
                           read.Set(status);
                         });
                   });
  return nullptr;
}

}  // namespace

PJRT_Error* BufferDestroy(PJRT_Buffer_Destroy_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Buffer_Destroy_Args);
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  if (args->buffer != nullptr && (*plugin)->DeferDestroy(args->buffer)) return nullptr;
  return (*plugin)->wrapped().PJRT_Buffer_Destroy(args);
}

PJRT_Error* ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  FERRY_CHECK_PLUGIN_ARGS(args, PJRT_Buffer_ToHostBuffer_Args);
  if (args->src == nullptr) return MakeError(InvalidArgumentError("ToHostBuffer: null src"));
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  const PJRT_Api& api = (*plugin)->wrapped();
  if (args->dst == nullptr) return ByPlugin(api, args);
  if (std::optional<Future<>> pending = (*plugin)->PendingPut(args->src); pending.has_value()) {
    if (std::optional<PJRT_Error*> deferred = ReadOnceComplete(**plugin, *pending, args)) {
      return *deferred;
    }
    // Another host layout (or a type ferry does not know): the plugin's read, which waits for
    // the fulfilment itself; ferry does not touch a buffer that has no memory yet.
    return ByPlugin(api, args);
  }
  std::optional<Future<>> until_complete;
  std::optional<ReadableBuffer> source = Readable(**plugin, args->src, &until_complete);
  if (!source.has_value()) {
    // One ferry would read once the plugin completes it: read then, and return at once now.
    if (until_complete.has_value()) {
      if (std::optional<PJRT_Error*> deferred = ReadOnceComplete(**plugin, *until_complete, args)) {
        return *deferred;
      }
    }
    return ByPlugin(api, args);
  }
  // A host layout asked for is honoured here only when it is the buffer's own (row-major,
  // untiled: what torch_xla always passes); any other is the plugin's to lay out.
  if (args->host_layout != nullptr &&
      !pjrt::IsRowMajorUntiled(*args->host_layout, source->dims.size())) {
    ReleaseHold(**plugin, args->src);
    return ByPlugin(api, args);
  }
  StatusOr<Future<>> started =
      StartHeldRead(**plugin, *source, args->src, args->dst, args->dst_size, /*copy_in_call=*/true);
  if (!started.ok()) return MakeError(started.status());
  args->event = MakeEvent(*std::move(started));
  return nullptr;
}

}  // namespace ferry::plugin
