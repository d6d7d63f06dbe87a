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
  if (args.struct_size < PJRT_STRUCT_SIZE(PJRT_Client_BufferFromHostBuffer_Args, memory)) {
    return InvalidArgumentError(fmt::format(
        "{}: args.struct_size {} is older than any caller ferry supports (a header before 0.40)",
        kWhat, args.struct_size));
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

// ferry's path: the source into warm memory, then a view of it. `args` is checked.
Status WriteAndView(WrappedPlugin& plugin, PJRT_Client_BufferFromHostBuffer_Args& args, DType dtype,
                    PJRT_Memory* memory) {
  const PJRT_Api& api = plugin.wrapped();
  Dims dims(args.dims, args.dims + args.num_dims);
  Dims strides = args.byte_strides != nullptr
                     ? Dims(args.byte_strides, args.byte_strides + args.num_byte_strides)
                     : RowMajorByteStrides(dims, DTypeSize(dtype));
  const HostView src(args.data, dtype, dims, std::move(strides));
  FERRY_RETURN_IF_ERROR(src.ComputeAddressedBytes(kWhat).status());
  const int64_t size_bytes = src.dense_size_bytes();
  FERRY_ASSIGN_OR_RETURN(
      auto allocation,
      DeviceAllocation::Create(plugin.memory(), size_bytes, kWhat, "the ferry plugin's device"));
  if (size_bytes > 0) {
    FERRY_ASSIGN_OR_RETURN(
        CopyConvertPlan plan,
        CopyConvertPlan::Create(src,
                                MutableHostView::Dense(allocation->mutable_data(), dtype, dims)));
    FERRY_ASSIGN_OR_RETURN(
        Future<> written,
        WriteThroughEngine(plugin.engine(), std::move(plan),
                           HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, allocation));
    FERRY_RETURN_IF_ERROR(written.Await());
  }
  auto view = FERRY_PJRT_ARGS(PJRT_Client_CreateViewOfDeviceBuffer_Args);
  view.client = args.client;
  view.device_buffer_ptr = size_bytes > 0 ? static_cast<void*>(allocation->mutable_data())
                                          : const_cast<std::byte*>(kEmpty);
  view.dims = args.dims;
  view.num_dims = args.num_dims;
  view.element_type = args.type;
  view.device = args.device;
  view.memory = memory;
  view.on_delete_callback = &GiveBackViewMemory;
  auto context = std::make_unique<ViewDeleteContext>(ViewDeleteContext{std::move(allocation)});
  view.on_delete_callback_arg = context.get();
  HandOffToPlugin(context.get());
  FERRY_RETURN_IF_ERROR(TakeError(api, api.PJRT_Client_CreateViewOfDeviceBuffer(&view)));
  context.release();  // the plugin's now, until on_delete

  // The source has been read: the buffer's own (complete) ready event says so.
  auto ready = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = view.buffer;
  if (Status status = TakeError(api, api.PJRT_Buffer_ReadyEvent(&ready)); !status.ok()) {
    auto destroy = FERRY_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
    destroy.buffer = view.buffer;
    TakeError(api, api.PJRT_Buffer_Destroy(&destroy)).IgnoreError();
    return status;
  }
  args.buffer = view.buffer;
  args.done_with_host_buffer = ready.event;
  return OkStatus();
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
        if (Status status = WriteAndView(**plugin, *args, *dtype, *memory); !status.ok()) {
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
