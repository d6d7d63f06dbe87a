#include "src/plugin/device_to_host.h"

#include <cstdint>
#include <optional>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_view.h"
#include "fmt/format.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/transfer_engine.h"
#include "src/plugin/plugin_errors.h"
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

void ReleaseHold(const PJRT_Api& api, PJRT_Buffer* buffer) {
  auto release = FERRY_PJRT_ARGS(PJRT_Buffer_DecreaseExternalReferenceCount_Args);
  release.buffer = buffer;
  TakeError(api, api.PJRT_Buffer_DecreaseExternalReferenceCount(&release)).IgnoreError();
}

// The buffer's memory when ferry may read it itself, with an external reference held on it (the
// caller releases it with ReleaseHold); nullopt (and no reference) when the plugin should read.
std::optional<ReadableBuffer> Readable(const WrappedPlugin& plugin, PJRT_Buffer* buffer) {
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
  auto type = FERRY_PJRT_ARGS(PJRT_Buffer_ElementType_Args);
  type.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_ElementType(&type)).ok()) return std::nullopt;
  std::optional<DType> dtype = FromPjrtType(type.type);
  if (!dtype.has_value()) return std::nullopt;
  auto dims = FERRY_PJRT_ARGS(PJRT_Buffer_Dimensions_Args);
  dims.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_Dimensions(&dims)).ok()) return std::nullopt;
  auto layout = FERRY_PJRT_ARGS(PJRT_Buffer_GetMemoryLayout_Args);
  layout.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_GetMemoryLayout(&layout)).ok() ||
      !pjrt::IsRowMajorUntiled(layout.layout, dims.num_dims)) {
    return std::nullopt;
  }
  // The external reference keeps the memory where it is, and alive, while ferry reads it (as it
  // does for DLPack or numpy), whatever another thread does to the buffer meanwhile.
  auto hold = FERRY_PJRT_ARGS(PJRT_Buffer_IncreaseExternalReferenceCount_Args);
  hold.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_IncreaseExternalReferenceCount(&hold)).ok()) {
    return std::nullopt;
  }
  auto pointer = FERRY_PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
  pointer.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&pointer)).ok()) {
    ReleaseHold(api, buffer);
    return std::nullopt;
  }
  return ReadableBuffer{static_cast<const std::byte*>(pointer.device_memory_ptr), *dtype,
                        Dims(dims.dims, dims.dims + dims.num_dims)};
}

// The buffer's ready event when it is complete without error (the caller owns it); else null.
PJRT_Event* CompleteReadyEvent(const PJRT_Api& api, PJRT_Buffer* buffer) {
  auto ready = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_ReadyEvent(&ready)).ok()) return nullptr;
  auto is_ready = FERRY_PJRT_ARGS(PJRT_Event_IsReady_Args);
  is_ready.event = ready.event;
  bool complete = TakeError(api, api.PJRT_Event_IsReady(&is_ready)).ok() && is_ready.is_ready;
  if (complete) {
    auto error = FERRY_PJRT_ARGS(PJRT_Event_Error_Args);
    error.event = ready.event;
    complete = TakeError(api, api.PJRT_Event_Error(&error)).ok();
  }
  if (!complete) {
    pjrt::DestroyEvent(api, ready.event);
    return nullptr;
  }
  return ready.event;
}

// The buffer's ready event, complete without error (the caller owns it), once the buffer is
// ready: a buffer still being computed (an Execute's output, which torch_xla reads at once) is
// waited for on this thread. Null when it failed (the plugin then reports that error).
PJRT_Event* ReadyEventOnceComputed(const PJRT_Api& api, PJRT_Buffer* buffer) {
  if (PJRT_Event* ready = CompleteReadyEvent(api, buffer)) return ready;
  auto pending = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  pending.buffer = buffer;
  if (!TakeError(api, api.PJRT_Buffer_ReadyEvent(&pending)).ok()) return nullptr;
  if (!pjrt::AwaitEvent(api, pending.event, "the buffer to read").ok()) return nullptr;
  return CompleteReadyEvent(api, buffer);
}

PJRT_Error* ByPlugin(const PJRT_Api& api, PJRT_Buffer_ToHostBuffer_Args* args) {
  CountTransferPath(TransferPath::kReadByPlugin);
  return api.PJRT_Buffer_ToHostBuffer(args);
}

// ferry's read of `source` (held by an external reference) into args->dst.
PJRT_Error* ReadHeld(WrappedPlugin& plugin, const ReadableBuffer& source,
                     PJRT_Buffer_ToHostBuffer_Args* args) {
  const PJRT_Api& api = plugin.wrapped();
  const HostView src = HostView::Dense(source.data, source.dtype, source.dims);
  const int64_t size_bytes = src.dense_size_bytes();
  if (args->dst_size < static_cast<size_t>(size_bytes)) {
    CountTransferPath(TransferPath::kRefused);
    return MakeError(InvalidArgumentError(
        fmt::format("ToHostBuffer: dst_size {} is smaller than the buffer's {} bytes",
                    args->dst_size, size_bytes)));
  }
  PJRT_Event* ready = ReadyEventOnceComputed(api, args->src);
  if (ready == nullptr) return ByPlugin(api, args);
  if (size_bytes > 0) {
    StatusOr<CopyConvertPlan> plan =
        CopyConvertPlan::Create(src, MutableHostView::Dense(args->dst, source.dtype, source.dims));
    StatusOr<Future<>> copied =
        plan.ok()
            ? WriteThroughEngine(plugin.engine(), *std::move(plan),
                                 HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, nullptr)
            : StatusOr<Future<>>(plan.status());
    Status status = copied.ok() ? copied->Await() : copied.status();
    if (!status.ok()) {
      pjrt::DestroyEvent(api, ready);
      return MakeError(status);
    }
  }
  // The copy is done: the (complete) ready event is the read's event.
  CountTransferPath(TransferPath::kReadByFerry);
  args->event = ready;
  return nullptr;
}

}  // namespace

PJRT_Error* ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  if (args == nullptr) return MakeError(InvalidArgumentError("ToHostBuffer: null args"));
  if (args->src == nullptr) return MakeError(InvalidArgumentError("ToHostBuffer: null src"));
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  const PJRT_Api& api = (*plugin)->wrapped();
  if (args->dst == nullptr) return ByPlugin(api, args);
  std::optional<ReadableBuffer> source = Readable(**plugin, args->src);
  if (!source.has_value()) return ByPlugin(api, args);
  // A host layout asked for is honoured here only when it is the buffer's own (row-major,
  // untiled: what torch_xla always passes); any other is the plugin's to lay out.
  if (args->host_layout != nullptr &&
      !pjrt::IsRowMajorUntiled(*args->host_layout, source->dims.size())) {
    ReleaseHold(api, args->src);
    return ByPlugin(api, args);
  }
  PJRT_Error* error = ReadHeld(**plugin, *source, args);
  ReleaseHold(api, args->src);
  return error;
}

}  // namespace ferry::plugin
