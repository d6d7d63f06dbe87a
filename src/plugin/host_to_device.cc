#include "src/plugin/host_to_device.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/host_view.h"
#include "fmt/format.h"
#include "src/core/tsan_hand_off.h"
#include "src/device/device_allocation.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/transfer_engine.h"
#include "src/plugin/plugin_errors.h"
#include "src/plugin/plugin_events.h"
#include "src/plugin/plugin_types.h"
#include "src/plugin/wrapped_plugin.h"

namespace ferry::plugin {
namespace {

constexpr std::string_view kWhat = "BufferFromHostBuffer";

// An empty tensor still needs a valid, aligned pointer: the plugins dereference null data.
alignas(64) const std::byte kEmpty[64] = {};

bool IsZeroCopy(PJRT_HostBufferSemantics semantics) {
  return semantics == PJRT_HostBufferSemantics_kImmutableZeroCopy ||
         semantics == PJRT_HostBufferSemantics_kMutableZeroCopy;
}

// The value a caller stored in a C enum field, read as an integer: a value outside the enum may not
// be read as the enum type (UBSan: "not a valid value for type").
template <typename Enum>
int64_t RawValue(const Enum& field) {
  std::underlying_type_t<Enum> value;
  std::memcpy(&value, &field, sizeof(value));
  return static_cast<int64_t>(value);
}

// Everything the XLA plugins crash on (../shared/REFERENCE.md), and what ferry itself needs to
// read the source safely. Sets `num_elements`.
Status Check(const PJRT_Client_BufferFromHostBuffer_Args& args, int64_t& num_elements) {
  // The two outputs (done_with_host_buffer, buffer) are the struct's last fields, after fields
  // that later headers inserted before them (memory, device_layout): a smaller struct has them
  // elsewhere, and writing them here would write past it. The XLA plugins refuse it the same way.
  if (args.struct_size < PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE) {
    return InvalidArgumentError(fmt::format(
        "{}: args.struct_size {} is smaller than the {} bytes of this header's struct, whose "
        "outputs lie at its end: a caller built against an older header than ferry supports",
        kWhat, args.struct_size, PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE));
  }
  if (args.client == nullptr) return InvalidArgumentError(fmt::format("{}: null client", kWhat));
  if (!IsKnownPjrtType(RawValue(args.type))) {
    return InvalidArgumentError(fmt::format(
        "{}: element type {} is not a valid PJRT_Buffer_Type (TOKEN and INVALID hold no data)",
        kWhat, RawValue(args.type)));
  }
  if (args.num_dims > 0 && args.dims == nullptr) {
    return InvalidArgumentError(
        fmt::format("{}: dims is null with num_dims {}", kWhat, args.num_dims));
  }
  if (args.num_dims > 64) {
    return InvalidArgumentError(fmt::format("{}: {} dims (at most 64)", kWhat, args.num_dims));
  }
  if (args.byte_strides != nullptr && args.num_byte_strides != args.num_dims) {
    return InvalidArgumentError(fmt::format("{}: {} byte strides for {} dims", kWhat,
                                            args.num_byte_strides, args.num_dims));
  }
  FERRY_ASSIGN_OR_RETURN(num_elements,
                         CheckedNumElements(absl::MakeConstSpan(args.dims, args.num_dims)));
  if (args.data == nullptr && num_elements > 0) {
    return InvalidArgumentError(
        fmt::format("{}: data is null for {} elements", kWhat, num_elements));
  }
  if (args.device == nullptr && args.memory == nullptr) {
    return InvalidArgumentError(fmt::format("{}: neither a device nor a memory", kWhat));
  }
  const int64_t semantics = RawValue(args.host_buffer_semantics);
  if (semantics != PJRT_HostBufferSemantics_kImmutableOnlyDuringCall &&
      semantics != PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes &&
      semantics != PJRT_HostBufferSemantics_kImmutableZeroCopy &&
      semantics != PJRT_HostBufferSemantics_kMutableZeroCopy) {
    return InvalidArgumentError(
        fmt::format("{}: unknown host_buffer_semantics {}", kWhat, semantics));
  }
  return OkStatus();
}

// The memory a buffer of `args` goes to, when it is its device's default memory (where ferry may
// place its own); nullopt otherwise.
std::optional<PJRT_Memory*> DefaultTargetMemory(const WrappedPlugin& plugin,
                                                const PJRT_Client_BufferFromHostBuffer_Args& args) {
  const PJRT_Api& api = plugin.wrapped();
  if (!FERRY_PJRT_HAS(plugin.library(), PJRT_Device_DefaultMemory)) return std::nullopt;
  PJRT_Device* device = args.device;
  if (args.memory != nullptr) {
    if (!FERRY_PJRT_HAS(plugin.library(), PJRT_Memory_AddressableByDevices)) return std::nullopt;
    auto devices = FERRY_PJRT_ARGS(PJRT_Memory_AddressableByDevices_Args);
    devices.memory = args.memory;
    if (!TakeError(api, api.PJRT_Memory_AddressableByDevices(&devices)).ok() ||
        devices.num_devices == 0) {
      return std::nullopt;
    }
    device = devices.devices[0];
  }
  auto default_memory = FERRY_PJRT_ARGS(PJRT_Device_DefaultMemory_Args);
  default_memory.device = device;
  if (!TakeError(api, api.PJRT_Device_DefaultMemory(&default_memory)).ok()) return std::nullopt;
  if (args.memory != nullptr && args.memory != default_memory.memory) return std::nullopt;
  return default_memory.memory;
}

struct ViewDeleteContext {
  std::shared_ptr<DeviceAllocation> allocation;
};

void GiveBackViewMemory(void* /*device_buffer_ptr*/, void* user_arg) {
  TakeBackFromPlugin(user_arg);
  delete static_cast<ViewDeleteContext*>(user_arg);
}

void DestroyBuffer(const PJRT_Api& api, PJRT_Buffer* buffer) {
  auto destroy = FERRY_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  destroy.buffer = buffer;
  TakeError(api, api.PJRT_Buffer_Destroy(&destroy)).IgnoreError();
}

// What a buffer of ferry's is made of: where it goes and the memory ferry writes it into.
struct Destination {
  PJRT_Client* client = nullptr;
  PJRT_Device* device = nullptr;
  PJRT_Memory* memory = nullptr;
  PJRT_Buffer_Type type = PJRT_Buffer_Type_INVALID;
  Dims dims;
  int64_t size_bytes = 0;
  std::shared_ptr<DeviceAllocation> allocation;
};

// The plan that writes `src` (the source of `args`, its addressed bytes checked by the caller),
// with its own byte strides, densely into new memory from ferry's warm cache (AllocateHostMemory:
// memory written before, not fresh pages).
StatusOr<std::pair<Destination, CopyConvertPlan>> PlanWrite(
    WrappedPlugin& plugin, const PJRT_Client_BufferFromHostBuffer_Args& args, const HostView& src,
    PJRT_Memory* memory) {
  const int64_t size_bytes = src.dense_size_bytes();
  FERRY_ASSIGN_OR_RETURN(
      auto allocation,
      DeviceAllocation::Create(plugin.memory(), size_bytes, kWhat, "the ferry plugin's device"));
  FERRY_ASSIGN_OR_RETURN(
      CopyConvertPlan plan,
      CopyConvertPlan::Create(
          src, MutableHostView::Dense(allocation->mutable_data(), src.dtype, src.dims)));
  return std::make_pair(Destination{args.client, args.device, memory, args.type, src.dims,
                                    size_bytes, std::move(allocation)},
                        std::move(plan));
}

// A buffer of the plugin's over the destination's memory, once written: a view
// (CreateViewOfDeviceBuffer, whose on_delete gives the memory back to ferry's cache).
StatusOr<PJRT_Buffer*> ViewOf(const PJRT_Api& api, const Destination& destination) {
  auto view = FERRY_PJRT_ARGS(PJRT_Client_CreateViewOfDeviceBuffer_Args);
  view.client = destination.client;
  view.device_buffer_ptr = destination.size_bytes > 0
                               ? static_cast<void*>(destination.allocation->mutable_data())
                               : const_cast<std::byte*>(kEmpty);
  view.dims = destination.dims.data();
  view.num_dims = destination.dims.size();
  view.element_type = destination.type;
  view.device = destination.device;
  view.memory = destination.memory;
  view.on_delete_callback = &GiveBackViewMemory;
  auto context = std::make_unique<ViewDeleteContext>(ViewDeleteContext{destination.allocation});
  view.on_delete_callback_arg = context.get();
  HandOffToPlugin(context.get());
  FERRY_RETURN_IF_ERROR(TakeError(api, api.PJRT_Client_CreateViewOfDeviceBuffer(&view)));
  context.release();  // the plugin's now, until on_delete
  return view.buffer;
}

// ferry's path during the call: the source into warm memory on the engine's workers, then a
// view of it. `args` is checked.
Status WriteAndView(WrappedPlugin& plugin, PJRT_Client_BufferFromHostBuffer_Args& args,
                    const HostView& src, PJRT_Memory* memory) {
  const PJRT_Api& api = plugin.wrapped();
  FERRY_ASSIGN_OR_RETURN(auto planned, PlanWrite(plugin, args, src, memory));
  auto& [destination, plan] = planned;
  if (destination.size_bytes > 0) {
    FERRY_ASSIGN_OR_RETURN(
        Future<> written, WriteThroughEngine(plugin.engine(), std::move(plan),
                                             HostBufferSemantics::kImmutableOnlyDuringCall, nullptr,
                                             destination.allocation));
    FERRY_RETURN_IF_ERROR(written.Await());
  }
  FERRY_ASSIGN_OR_RETURN(PJRT_Buffer * buffer, ViewOf(api, destination));

  // The source has been read: the buffer's own (complete) ready event says so.
  auto ready = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer;
  if (Status status = TakeError(api, api.PJRT_Buffer_ReadyEvent(&ready)); !status.ok()) {
    DestroyBuffer(api, buffer);
    return status;
  }
  args.buffer = buffer;
  args.done_with_host_buffer = ready.event;
  return OkStatus();
}

// A buffer of the plugin's that is not ready until ferry fulfils it with another buffer, whose
// memory it then takes over (PJRT_Client_CreateAliasBuffer). Every pending buffer is fulfilled
// exactly once (Fulfil), which also frees `fulfil`.
struct PendingBuffer {
  PJRT_Buffer* buffer = nullptr;
  PJRT_FulfillAliasBufferCallback* fulfil = nullptr;
};

StatusOr<PendingBuffer> CreatePending(const PJRT_Api& api,
                                      const PJRT_Client_BufferFromHostBuffer_Args& args,
                                      PJRT_Memory* memory) {
  // The row-major layout of ferry's dense memory, said explicitly: plugins at API 0.115 refuse an
  // alias without one ("on-device shape has no layout"), and the view that fulfils it has it.
  pjrt::RowMajorLayout layout(args.num_dims);
  auto alias = FERRY_PJRT_ARGS(PJRT_Client_CreateAliasBuffer_Args);
  alias.client = args.client;
  alias.memory = memory;
  alias.shape_dims = args.dims;
  alias.shape_num_dims = args.num_dims;
  alias.shape_element_type = args.type;
  alias.shape_layout = layout.get();
  FERRY_RETURN_IF_ERROR(TakeError(api, api.PJRT_Client_CreateAliasBuffer(&alias)));
  return PendingBuffer{alias.alias_buffer, alias.fulfill_alias_buffer_cb};
}

// Fulfils `pending` with `filled` (a buffer of ferry's, which the plugin takes over: its handle is
// destroyed here) or with the error that kept ferry from making it: the pending buffer is then
// ready, with that buffer's memory or with the error.
void Fulfil(const PJRT_Api& api, PJRT_Client* client, const PendingBuffer& pending,
            const StatusOr<PJRT_Buffer*>& filled) {
  auto fulfil = FERRY_PJRT_ARGS(PJRT_Client_FulfillAliasBuffer_Args);
  fulfil.client = client;
  fulfil.fulfill_alias_buffer_cb = pending.fulfil;
  if (filled.ok()) {
    fulfil.buffer = *filled;
    fulfil.status_code = PJRT_Error_Code_OK;
  } else {
    fulfil.status_code = static_cast<PJRT_Error_Code>(filled.status().code());
    fulfil.error_message = filled.status().message().data();
    fulfil.error_message_size = filled.status().message().size();
  }
  // A fulfilment the plugin refuses (a shape that differs) fails the pending buffer with that
  // error in the plugin itself: nothing is left to do here.
  TakeError(api, api.PJRT_Client_FulfillAliasBuffer(&fulfil)).IgnoreError();
  if (filled.ok()) DestroyBuffer(api, *filled);
}

// ferry's path after the call, where the caller keeps the source until done_with_host_buffer
// (every semantic but kImmutableOnlyDuringCall) and the plugin can make pending buffers: the
// call returns a pending buffer at once, the source is written on the engine's workers, and the
// buffer is fulfilled with a view of the written memory (on the plugin's fulfilment thread).
// done_with_host_buffer is ferry's own event, complete once the source has been read. Returns
// false, having made nothing, where the plugin refuses the pending buffer.
StatusOr<bool> WriteAfterTheCall(WrappedPlugin& plugin, PJRT_Client_BufferFromHostBuffer_Args& args,
                                 const HostView& src, PJRT_Memory* memory) {
  const PJRT_Api& api = plugin.wrapped();
  FERRY_ASSIGN_OR_RETURN(auto planned, PlanWrite(plugin, args, src, memory));
  auto& [destination, plan] = planned;
  StatusOr<PendingBuffer> pending = CreatePending(api, args, memory);
  if (!pending.ok()) {
    if (absl::IsUnimplemented(pending.status())) plugin.AliasRefused();
    return false;
  }
  StatusOr<Future<>> written = WriteThroughEngine(
      plugin.engine(), std::move(plan), HostBufferSemantics::kImmutableUntilTransferCompletes,
      nullptr, destination.allocation);
  if (!written.ok()) {
    Fulfil(api, args.client, *pending, written.status());
    DestroyBuffer(api, pending->buffer);
    return written.status();
  }
  // Reads of the buffer before its fulfilment start after it, off the caller's thread. The
  // fulfilment needs the client: its Destroy waits for it (WaitForClientWork).
  Promise<> fulfilled;
  const uint64_t pending_id = plugin.AddPendingPut(pending->buffer, fulfilled.future());
  plugin.BeginClientWork();
  written->OnReady(
      plugin.fulfilments(), [&api, plugin = &plugin, pending = *pending, pending_id, fulfilled,
                             destination = std::move(destination)](const Status& status) {
        // The workers' writes happen before whatever reads the memory once the plugin has
        // made the buffer ready (ferry's reads take it back: device_to_host.cc).
        HandOffToPlugin(destination.allocation->mutable_data());
        Fulfil(api, destination.client, pending,
               status.ok() ? ViewOf(api, destination) : StatusOr<PJRT_Buffer*>(status));
        plugin->RemovePendingPut(pending.buffer, pending_id);
        fulfilled.Set(OkStatus());
        plugin->EndClientWork();
      });
  args.buffer = pending->buffer;
  args.done_with_host_buffer = MakeEvent(*std::move(written));
  return true;
}

}  // namespace

PJRT_Error* BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args) {
  if (args == nullptr) return MakeError(InvalidArgumentError("BufferFromHostBuffer: null args"));
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  const PJRT_Api& api = (*plugin)->wrapped();
  int64_t num_elements = 0;
  if (Status status = Check(*args, num_elements); !status.ok()) {
    CountTransferPath(TransferPath::kRefused);
    return MakeError(status);
  }

  const std::optional<DType> dtype = FromPjrtType(args->type);
  const bool has_layout =
      args->struct_size >= PJRT_STRUCT_SIZE(PJRT_Client_BufferFromHostBuffer_Args, device_layout) &&
      args->device_layout != nullptr;
  if (dtype.has_value() && !has_layout && (*plugin)->HostAddressable(args->client)) {
    // Validated before anything reads its shape: strides that address bytes beyond int64, or a
    // size in bytes that overflows (a zero-stride view of huge dims), are refused here.
    Dims dims(args->dims, args->dims + args->num_dims);
    Dims strides = args->byte_strides != nullptr
                       ? Dims(args->byte_strides, args->byte_strides + args->num_byte_strides)
                       : RowMajorByteStrides(dims, DTypeSize(*dtype));
    const HostView src(args->data, *dtype, std::move(dims), std::move(strides));
    if (Status status = src.ComputeAddressedBytes(kWhat).status(); !status.ok()) {
      CountTransferPath(TransferPath::kRefused);
      return MakeError(status);
    }
    const bool dense = args->byte_strides == nullptr || src.IsRowMajorDense();
    const bool aliasable = IsZeroCopy(args->host_buffer_semantics) && dense && num_elements > 0 &&
                           reinterpret_cast<uintptr_t>(args->data) % kHostAlignment == 0;
    if (!aliasable) {
      if (std::optional<PJRT_Memory*> memory = DefaultTargetMemory(**plugin, *args)) {
        // A zero-copy request ferry cannot alias is served as the wrapped plugins serve it: a
        // dense source read after the call, a strided one copied during it. JAX asks zero-copy
        // for numpy arrays and relies on that copy (a numpy source changed right after
        // jax.device_put(x.T) must not show in the array: written after the call, it did in
        // about half of the puts). kImmutableUntilTransferCompletes promises the source until
        // done_with_host_buffer whatever its layout: written after the call.
        const bool after_the_call_allowed =
            args->host_buffer_semantics ==
                PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes ||
            (dense &&
             args->host_buffer_semantics != PJRT_HostBufferSemantics_kImmutableOnlyDuringCall);
        if (after_the_call_allowed && src.dense_size_bytes() > kInlineWriteBytes &&
            (*plugin)->MayAlias()) {
          StatusOr<bool> started = WriteAfterTheCall(**plugin, *args, src, *memory);
          if (!started.ok()) return MakeError(started.status());
          if (*started) {
            CountTransferPath(TransferPath::kPutByFerryAfterTheCall);
            return nullptr;
          }
        }
        if (Status status = WriteAndView(**plugin, *args, src, *memory); !status.ok()) {
          return MakeError(status);
        }
        CountTransferPath(TransferPath::kPutByFerry);
        return nullptr;
      }
    }
  }
  CountTransferPath(TransferPath::kPutByPlugin);
  if (args->data != nullptr) return api.PJRT_Client_BufferFromHostBuffer(args);
  // An empty array with null data: the plugins dereference it, so they get a valid pointer for
  // the call; the caller's args are left as they were.
  args->data = kEmpty;
  PJRT_Error* error = api.PJRT_Client_BufferFromHostBuffer(args);
  args->data = nullptr;
  return error;
}

}  // namespace ferry::plugin
