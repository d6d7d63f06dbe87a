#include "src/device/pjrt/pjrt_client.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/tsan_hand_off.h"
#include "src/device/piece_counter.h"
#include "src/device/pjrt/pjrt_buffer.h"

namespace ferry::pjrt {
namespace {

std::string View(const char* data, size_t size) {
  return data == nullptr ? std::string() : std::string(data, size);
}

std::vector<std::string> MemoryKinds(const std::vector<PjrtMemorySpace>& memories) {
  std::vector<std::string> kinds;
  for (const PjrtMemorySpace& space : memories) kinds.push_back(space.kind);
  return kinds;
}

// The named values for PJRT_Client_Create and the names they point at.
struct NamedValues {
  std::vector<PJRT_NamedValue> values;
  std::vector<std::string> names;
};

StatusOr<NamedValues> MakeNamedValues(const ClientOptions& options) {
  std::map<std::string, ClientOptions::PluginOptionValue> merged = options.plugin_options;
  if (options.num_devices.has_value() && !merged.contains("cpu_device_count")) {
    merged["cpu_device_count"] = int64_t{*options.num_devices};
  }
  if (auto it = merged.find("cpu_device_count"); it != merged.end()) {
    // The CPU plugins crash on a negative or non-integer count.
    const int64_t* count = std::get_if<int64_t>(&it->second);
    if (count == nullptr || *count < 1 || *count > 1024) {
      return InvalidArgumentError("pjrt option cpu_device_count must be an integer from 1 to 1024");
    }
  }
  NamedValues named;
  named.names.reserve(merged.size());
  for (const auto& [name, value] : merged) {
    named.names.push_back(name);
    PJRT_NamedValue entry{};
    entry.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    entry.name = named.names.back().c_str();
    entry.name_size = named.names.back().size();
    if (const auto* integer = std::get_if<int64_t>(&value)) {
      entry.type = PJRT_NamedValue_kInt64;
      entry.int64_value = *integer;
      entry.value_size = 1;
    } else if (const auto* real = std::get_if<double>(&value)) {
      entry.type = PJRT_NamedValue_kFloat;
      entry.float_value = static_cast<float>(*real);
      entry.value_size = 1;
    } else if (const auto* flag = std::get_if<bool>(&value)) {
      entry.type = PJRT_NamedValue_kBool;
      entry.bool_value = *flag;
      entry.value_size = 1;
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      entry.type = PJRT_NamedValue_kString;
      entry.string_value = text->c_str();
      entry.value_size = text->size();
    } else {
      const auto& list = std::get<std::vector<int64_t>>(value);
      entry.type = PJRT_NamedValue_kInt64List;
      entry.int64_array_value = list.data();
      entry.value_size = list.size();
    }
    named.values.push_back(entry);
  }
  return named;
}

// `put`, counted on `transfers` (DirectTransfers or ConvertedTransfers) when it succeeded: one
// count per put, whichever path made it.
StatusOr<std::unique_ptr<Buffer>> CountedPut(Counter* transfers,
                                             StatusOr<std::unique_ptr<Buffer>> put) {
  if (put.ok()) transfers->Add();
  return put;
}

// True when the plugin can read `src` with its own strided copy: native byte order, and every
// byte stride a whole number of elements (the plugins read other strides wrongly, unchecked).
bool PluginCanReadStrides(const HostView& src) {
  if (!src.IsNativeByteOrder()) return false;
  const int64_t element_size = src.element_size();
  for (int64_t stride : src.byte_strides) {
    if (stride % element_size != 0) return false;
  }
  return true;
}

// The device's kind ("cpu", a GPU's model name), from its description.
StatusOr<std::string> DeviceKindOf(const PjrtRuntime& runtime, PJRT_Device* device) {
  const PJRT_Api& api = runtime.api();
  auto description = FERRY_PJRT_ARGS(PJRT_Device_GetDescription_Args);
  description.device = device;
  FERRY_RETURN_IF_ERROR(
      runtime.Check(api.PJRT_Device_GetDescription(&description), "Device_GetDescription"));
  auto kind = FERRY_PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  kind.device_description = description.device_description;
  FERRY_RETURN_IF_ERROR(runtime.Check(api.PJRT_DeviceDescription_Kind(&kind), "Kind"));
  return View(kind.device_kind, kind.device_kind_size);
}

// The device's default memory; null when the plugin has no memories (older plugins) or cannot
// say, which leaves the choice of memory to the plugin.
PJRT_Memory* DefaultMemoryOf(const PjrtRuntime& runtime, PJRT_Device* device) {
  if (!FERRY_PJRT_HAS(runtime.library(), PJRT_Device_DefaultMemory)) return nullptr;
  auto memory = FERRY_PJRT_ARGS(PJRT_Device_DefaultMemory_Args);
  memory.device = device;
  if (!runtime.Check(runtime.api().PJRT_Device_DefaultMemory(&memory), "DefaultMemory").ok()) {
    return nullptr;
  }
  return memory.memory;
}

// The device's addressable memories with their kinds; empty on plugins that cannot list them,
// and without the ones whose kind the plugin cannot name (a memory is chosen by its kind).
std::vector<PjrtMemorySpace> MemorySpacesOf(const PjrtRuntime& runtime, PJRT_Device* device) {
  const PJRT_Api& api = runtime.api();
  std::vector<PjrtMemorySpace> spaces;
  if (!FERRY_PJRT_HAS(runtime.library(), PJRT_Device_AddressableMemories) ||
      !FERRY_PJRT_HAS(runtime.library(), PJRT_Memory_Kind)) {
    return spaces;
  }
  auto memories = FERRY_PJRT_ARGS(PJRT_Device_AddressableMemories_Args);
  memories.device = device;
  if (!runtime.Check(api.PJRT_Device_AddressableMemories(&memories), "Memories").ok()) {
    return spaces;
  }
  for (size_t m = 0; m < memories.num_memories; ++m) {
    auto memory_kind = FERRY_PJRT_ARGS(PJRT_Memory_Kind_Args);
    memory_kind.memory = memories.memories[m];
    if (runtime.Check(api.PJRT_Memory_Kind(&memory_kind), "Memory_Kind").ok()) {
      spaces.push_back({View(memory_kind.kind, memory_kind.kind_size), memories.memories[m]});
    }
  }
  return spaces;
}

// A device's memories as the MemorySpaces it reports, the default first.
std::vector<MemorySpace> AsMemorySpaces(const std::vector<PjrtMemorySpace>& memories,
                                        PJRT_Memory* default_memory) {
  std::vector<MemorySpace> spaces;
  for (const PjrtMemorySpace& space : memories) {
    const bool is_default = space.memory == default_memory;
    spaces.insert(is_default ? spaces.begin() : spaces.end(), {space.kind, is_default});
  }
  // A plugin without memories still has the device's own.
  if (spaces.empty() || !spaces.front().is_default) spaces.insert(spaces.begin(), {"device", true});
  return spaces;
}

}  // namespace

PJRT_Buffer_Type ToPjrtType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return PJRT_Buffer_Type_PRED;
    case DType::kS8:
      return PJRT_Buffer_Type_S8;
    case DType::kS16:
      return PJRT_Buffer_Type_S16;
    case DType::kS32:
      return PJRT_Buffer_Type_S32;
    case DType::kS64:
      return PJRT_Buffer_Type_S64;
    case DType::kU8:
      return PJRT_Buffer_Type_U8;
    case DType::kU16:
      return PJRT_Buffer_Type_U16;
    case DType::kU32:
      return PJRT_Buffer_Type_U32;
    case DType::kU64:
      return PJRT_Buffer_Type_U64;
    case DType::kF16:
      return PJRT_Buffer_Type_F16;
    case DType::kBF16:
      return PJRT_Buffer_Type_BF16;
    case DType::kF32:
      return PJRT_Buffer_Type_F32;
    case DType::kF64:
      return PJRT_Buffer_Type_F64;
    case DType::kC64:
      return PJRT_Buffer_Type_C64;
    case DType::kC128:
      return PJRT_Buffer_Type_C128;
    case DType::kF8E4M3FN:
      return PJRT_Buffer_Type_F8E4M3FN;
    case DType::kF8E5M2:
      return PJRT_Buffer_Type_F8E5M2;
  }
  return PJRT_Buffer_Type_INVALID;
}

// ---------------------------------------------------------------------------------------------

PjrtDevice::PjrtDevice(PjrtClient* client, int index, PJRT_Device* device,
                       PJRT_Memory* default_memory, std::string kind,
                       std::vector<PjrtMemorySpace> memories, DeviceCapabilities capabilities)
    : client_(client),
      index_(index),
      name_(fmt::format("pjrt:{}", index)),
      device_(device),
      default_memory_(default_memory),
      kind_(std::move(kind)),
      memories_(std::move(memories)),
      memory_spaces_(AsMemorySpaces(memories_, default_memory)),
      capabilities_(std::move(capabilities)),
      memory_(std::make_shared<MemoryAccount>(capabilities_.memory_limit_bytes)),
      staging_{
          std::make_unique<StagingRing>(fmt::format("{} (host to device)", name_),
                                        PjrtStagingPinning::Allocator(client->staging_pinning())),
          std::make_unique<StagingRing>(fmt::format("{} (device to host)", name_),
                                        PjrtStagingPinning::Allocator(client->staging_pinning()))} {
}

DeviceMemoryStats PjrtDevice::memory_stats() const {
  if (std::optional<DeviceMemoryStats> stats = PluginMemoryStats(*client_->runtime(), device_)) {
    return *stats;
  }
  return Device::memory_stats();
}

void PjrtDevice::ShutdownStaging() {
  for (const std::unique_ptr<StagingRing>& ring : staging_) ring->Shutdown();
}

Client* PjrtDevice::client() const { return client_; }

bool PjrtDevice::CopiesBuffersTo(const Device* target) const {
  if (target == nullptr || target->client() != client_) return false;
  return FERRY_PJRT_HAS(client_->runtime()->library(), PJRT_Buffer_CopyToDevice) &&
         !client_->platform().direct_host_access;
}

StatusOr<NativeDeviceHandles> PjrtDevice::NativeHandles() const {
  const std::shared_ptr<PjrtRuntime>& runtime = client_->runtime();
  NativeDeviceHandles handles;
  handles.backend = "pjrt";
  handles.library = client_->platform().plugin_path;
  handles.api = const_cast<PJRT_Api*>(&runtime->api());
  handles.client = runtime->client();
  handles.device = device_;
  handles.memory = default_memory_;
  handles.memory_on_host = client_->platform().buffers_on_cpu;
  return handles;
}

std::optional<AddressSpace> DeviceAddressSpaceOf(std::string_view platform_name) {
  if (platform_name == "cuda" || platform_name == "gpu") return AddressSpace::kCuda;
  if (platform_name == "rocm") return AddressSpace::kRocm;
  return std::nullopt;
}

PJRT_Memory* PjrtDevice::FindMemory(std::string_view kind) const {
  for (const PjrtMemorySpace& space : memories_) {
    if (kind.empty() ? space.memory == default_memory_ : space.kind == kind) return space.memory;
  }
  return kind.empty() || kind == "device" ? default_memory_ : nullptr;
}

std::string PjrtDevice::description() const {
  const PjrtPlatformInfo& platform = client_->platform();
  std::string plugin = platform.plugin_path;
  if (size_t slash = plugin.rfind('/'); slash != std::string::npos)
    plugin = plugin.substr(slash + 1);
  return fmt::format(
      "{} {} (PJRT {} API {}.{}; memories {}; {}; {}; {})", platform.platform_name, kind_, plugin,
      platform.api_major, platform.api_minor, fmt::join(MemoryKinds(memories_), ","),
      platform.direct_host_access ? "direct host access" : "plugin transfers",
      platform.row_major_layouts ? "row-major layouts" : "layouts left to the plugin",
      client_->staging_pinning()->pins() ? "pinned staging" : "pageable staging");
}

// ---------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<Client>> PjrtClient::Create(const ClientOptions& options) {
  FERRY_ASSIGN_OR_RETURN(const std::string path, FindPjrtPlugin(options.pjrt_plugin.value_or("")));
  FERRY_ASSIGN_OR_RETURN(const PjrtLibrary* library, LoadPjrtLibrary(path));
  // Every option is checked before PJRT_Client_Create: a plugin's client is expensive to make
  // and to leak (its threads; on a GPU its preallocated device memory).
  FERRY_ASSIGN_OR_RETURN(NamedValues named, MakeNamedValues(options));
  const int num_workers = options.num_worker_threads.value_or(
      std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  if (num_workers < 1) return InvalidArgumentError("the pjrt backend needs a worker thread");
  auto args = FERRY_PJRT_ARGS(PJRT_Client_Create_Args);
  args.create_options = named.values.data();
  args.num_options = named.values.size();
  if (PJRT_Error* error = library->api->PJRT_Client_Create(&args); error != nullptr) {
    Status status =
        ErrorToStatus(*library->api, error, fmt::format("PJRT_Client_Create ({})", path));
    return UnavailableError(status.message());
  }
  // Owned from here: whatever fails next, the runtime's destructor destroys the PJRT client.
  auto runtime = std::make_shared<PjrtRuntime>(*library, args.client);
  std::unique_ptr<PjrtClient> client(new PjrtClient(std::move(runtime), num_workers));
  FERRY_RETURN_IF_ERROR(client->Initialize(options));
  return std::unique_ptr<Client>(std::move(client));
}

PjrtClient::PjrtClient(std::shared_ptr<PjrtRuntime> runtime, int num_workers)
    : runtime_(std::move(runtime)), num_workers_(num_workers) {}

PjrtClient::~PjrtClient() {
  runtime_->lifetime()->Close();
  for (const std::unique_ptr<PjrtDevice>& device : devices_) device->ShutdownStaging();
  if (engine_ != nullptr) engine_->Shutdown();
  runtime_->lifetime()->WaitUntilIdle();
}

Status PjrtClient::Initialize(const ClientOptions& options) {
  FERRY_RETURN_IF_ERROR(ReadPlatformInfo());
  staging_pinning_ = std::make_shared<const PjrtStagingPinning>(runtime_);
  FERRY_RETURN_IF_ERROR(AddDevices(options));
  FERRY_RETURN_IF_ERROR(ProbeBuffers());
  const PjrtLibrary& library = runtime_->library();
  platform_.row_major_layouts =
      platform_.row_major_layouts && options.pjrt_row_major_layouts.value_or(true);
  platform_.direct_host_access = platform_.buffers_on_cpu && platform_.row_major_layouts &&
                                 options.pjrt_direct_host_access.value_or(true) &&
                                 FERRY_PJRT_HAS(library, PJRT_Client_CreateViewOfDeviceBuffer) &&
                                 FERRY_PJRT_HAS(library, PJRT_Buffer_OpaqueDeviceMemoryDataPointer);
  // The CPU copy engine's threads serve only memory the host addresses (the direct path, reads of
  // a CPU plugin's buffers): a plugin whose buffers are elsewhere (a GPU's) starts none.
  if (platform_.buffers_on_cpu) engine_ = std::make_shared<TransferEngine>(num_workers_);
  return OkStatus();
}

Status PjrtClient::ReadPlatformInfo() {
  const PJRT_Api& api = runtime_->api();
  const PjrtLibrary& library = runtime_->library();
  platform_.plugin_path = library.path;
  platform_.api_major = library.major_version;
  platform_.api_minor = library.minor_version;
  {
    auto args = FERRY_PJRT_ARGS(PJRT_Client_PlatformName_Args);
    args.client = runtime_->client();
    FERRY_RETURN_IF_ERROR(runtime_->Check(api.PJRT_Client_PlatformName(&args), "PlatformName"));
    platform_.platform_name = View(args.platform_name, args.platform_name_size);
  }
  if (FERRY_PJRT_HAS(library, PJRT_Client_PlatformVersion)) {
    auto args = FERRY_PJRT_ARGS(PJRT_Client_PlatformVersion_Args);
    args.client = runtime_->client();
    if (runtime_->Check(api.PJRT_Client_PlatformVersion(&args), "PlatformVersion").ok()) {
      platform_.platform_version = View(args.platform_version, args.platform_version_size);
    }
  }
  platform_.has_transfer_manager =
      FERRY_PJRT_HAS(library, PJRT_Client_CreateBuffersForAsyncHostToDevice) &&
      FERRY_PJRT_HAS(library, PJRT_AsyncHostToDeviceTransferManager_TransferData) &&
      FERRY_PJRT_HAS(library, PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer) &&
      FERRY_PJRT_HAS(library, PJRT_AsyncHostToDeviceTransferManager_Destroy);
  platform_.has_raw_reads = FERRY_PJRT_HAS(library, PJRT_Buffer_CopyRawToHost);
  return OkStatus();
}

Status PjrtClient::AddDevices(const ClientOptions& options) {
  const PJRT_Api& api = runtime_->api();
  auto devices_args = FERRY_PJRT_ARGS(PJRT_Client_AddressableDevices_Args);
  devices_args.client = runtime_->client();
  FERRY_RETURN_IF_ERROR(
      runtime_->Check(api.PJRT_Client_AddressableDevices(&devices_args), "AddressableDevices"));
  size_t count = devices_args.num_addressable_devices;
  if (options.num_devices.has_value()) {
    count = std::min(count, static_cast<size_t>(std::max(0, *options.num_devices)));
  }
  if (count == 0) {
    return UnavailableError(
        fmt::format("the PJRT plugin {} has no addressable device", runtime_->library().path));
  }
  DeviceCapabilities capabilities = options.capabilities.value_or(DeviceCapabilities::All());
  for (size_t i = 0; i < count; ++i) {
    PJRT_Device* device = devices_args.addressable_devices[i];
    FERRY_ASSIGN_OR_RETURN(std::string kind, DeviceKindOf(*runtime_, device));
    PJRT_Memory* default_memory = DefaultMemoryOf(*runtime_, device);
    std::vector<PjrtMemorySpace> spaces = MemorySpacesOf(*runtime_, device);
    devices_.push_back(std::make_unique<PjrtDevice>(this, static_cast<int>(i), device,
                                                    default_memory, std::move(kind),
                                                    std::move(spaces), capabilities));
    device_pointers_.push_back(devices_.back().get());
  }
  return OkStatus();
}

Status PjrtClient::ProbeBuffers() {
  const PJRT_Api& api = runtime_->api();
  const PjrtLibrary& library = runtime_->library();
  // Without the layout entry: the layouts XLA's CPU and GPU plugins give by default.
  const std::string& platform = platform_.platform_name;
  platform_.row_major_layouts =
      platform == "cpu" || platform == "cuda" || platform == "gpu" || platform == "rocm";
  if (!FERRY_PJRT_HAS(library, PJRT_Buffer_IsOnCpu) &&
      !FERRY_PJRT_HAS(library, PJRT_Buffer_GetMemoryLayout)) {
    return OkStatus();
  }
  // Two dims, neither a multiple of a tile: a tiled or column-major layout shows.
  alignas(64) static const float kProbe[15] = {};
  const int64_t dims[2] = {3, 5};
  auto put = FERRY_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  put.client = runtime_->client();
  put.data = kProbe;
  put.type = PJRT_Buffer_Type_F32;
  put.dims = dims;
  put.num_dims = 2;
  put.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  put.device = devices_[0]->pjrt_device();
  FERRY_RETURN_IF_ERROR(
      runtime_->Check(api.PJRT_Client_BufferFromHostBuffer(&put), "probe BufferFromHostBuffer"));
  AwaitEvent(api, put.done_with_host_buffer, "probe").IgnoreError();
  PjrtBufferHandle probe(runtime_, put.buffer);
  if (FERRY_PJRT_HAS(library, PJRT_Buffer_IsOnCpu)) {
    auto on_cpu = FERRY_PJRT_ARGS(PJRT_Buffer_IsOnCpu_Args);
    on_cpu.buffer = put.buffer;
    if (runtime_->Check(api.PJRT_Buffer_IsOnCpu(&on_cpu), "IsOnCpu").ok()) {
      platform_.buffers_on_cpu = on_cpu.is_on_cpu;
    }
  }
  if (FERRY_PJRT_HAS(library, PJRT_Buffer_GetMemoryLayout)) {
    auto layout = FERRY_PJRT_ARGS(PJRT_Buffer_GetMemoryLayout_Args);
    layout.buffer = put.buffer;
    platform_.row_major_layouts =
        runtime_->Check(api.PJRT_Buffer_GetMemoryLayout(&layout), "GetMemoryLayout").ok() &&
        IsRowMajorUntiled(layout.layout, 2);
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Buffer>> PjrtClient::BufferFromHostBuffer(
    const HostView& src, DType device_dtype, Device* device, HostBufferSemantics semantics,
    OnDoneWithHostBuffer on_done, std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(
      CheckBufferFromHostBufferArgs(*this, src, device_dtype, device, tensor_name));
  auto* pjrt_device = static_cast<PjrtDevice*>(device);
  FERRY_RETURN_IF_ERROR(DeviceBytesFor(src, device_dtype, *device, tensor_name).status());
  const bool same_dtype = src.dtype == device_dtype;
  if (semantics == HostBufferSemantics::kImmutableZeroCopy) {
    // Only where ferry can read a buffer's address in host memory can it tell an alias from a
    // copy after the call. Elsewhere (every GPU plugin) the plugin copies anyway: the put is a
    // copy, reserved up front and counted as a fallback like any source that cannot alias.
    const bool alias_visible =
        platform_.buffers_on_cpu && platform_.row_major_layouts &&
        FERRY_PJRT_HAS(runtime_->library(), PJRT_Buffer_OpaqueDeviceMemoryDataPointer);
    const bool aliasable = alias_visible && same_dtype && src.IsRowMajorDense() &&
                           src.IsNativeByteOrder() && src.num_elements() > 0 &&
                           reinterpret_cast<uintptr_t>(src.data) % kHostAlignment == 0;
    if (aliasable) {
      return CountedPut(
          metrics::DirectTransfers(),
          PutThroughPlugin(src, pjrt_device, semantics, std::move(on_done), tensor_name));
    }
    metrics::ZeroCopyFallbacks()->Add();
    semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  }
  if (platform_.direct_host_access) {
    return PutDirect(src, device_dtype, pjrt_device, semantics, std::move(on_done), tensor_name);
  }
  if (same_dtype && (PluginCanReadStrides(src) || src.num_elements() == 0)) {
    return CountedPut(
        metrics::DirectTransfers(),
        PutThroughPlugin(src, pjrt_device, semantics, std::move(on_done), tensor_name));
  }
  if (!platform_.writes_at_byte_offsets()) {
    return PutConvertedThroughPlugin(src, device_dtype, pjrt_device, semantics, std::move(on_done),
                                     tensor_name);
  }
  return PutStaged(src, device_dtype, pjrt_device, semantics, std::move(on_done), tensor_name);
}

StatusOr<std::unique_ptr<Buffer>> PjrtClient::PutConvertedThroughPlugin(
    const HostView& src, DType device_dtype, PjrtDevice* device, HostBufferSemantics semantics,
    OnDoneWithHostBuffer on_done, std::string_view tensor_name) {
  // The whole tensor converted into dense host memory on this thread (the source is read when
  // this returns), which the plugin then lays out itself; the temporary lives until the plugin is
  // done with it, and `on_done` runs then, on the thread PutThroughPlugin says.
  FERRY_ASSIGN_OR_RETURN(auto converted, HostTensor::Allocate(device_dtype, src.dims));
  FERRY_ASSIGN_OR_RETURN(CopyConvertPlan plan,
                         CopyConvertPlan::Create(src, converted.mutable_view()));
  plan.CopyAll();
  auto held = std::make_shared<HostTensor>(std::move(converted));
  const HostView dense = held->view();
  OnDoneWithHostBuffer release = [held = std::move(held), on_done = std::move(on_done)]() mutable {
    held.reset();
    if (on_done) std::move(on_done)();
  };
  // Like PutStaged, which it stands in for, a conversion or a re-striding: never a zero-copy put
  // (BufferFromHostBuffer has made those kImmutableUntilTransferCompletes already).
  return CountedPut(metrics::ConvertedTransfers(),
                    PutThroughPlugin(dense, device, semantics, std::move(release), tensor_name));
}

namespace {

// The arguments of PJRT_Client_BufferFromHostBuffer that have the plugin read `src` itself, with
// its byte strides when it is not dense. They point into `src`.
PJRT_Client_BufferFromHostBuffer_Args PluginPutArgs(PJRT_Client* client, const HostView& src,
                                                    const PjrtDevice& device,
                                                    HostBufferSemantics semantics) {
  // An empty tensor still needs a valid pointer: plugins dereference null data.
  alignas(64) static const std::byte kEmpty[64] = {};
  auto args = FERRY_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = client;
  args.data = src.num_elements() == 0 ? kEmpty : src.data;
  args.type = ToPjrtType(src.dtype);
  args.dims = src.dims.data();
  args.num_dims = src.dims.size();
  if (src.num_elements() > 0 && !src.IsRowMajorDense()) {
    args.byte_strides = src.byte_strides.data();
    args.num_byte_strides = src.byte_strides.size();
  }
  switch (semantics) {
    case HostBufferSemantics::kImmutableOnlyDuringCall:
      args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
      break;
    case HostBufferSemantics::kImmutableUntilTransferCompletes:
      args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
      break;
    case HostBufferSemantics::kImmutableZeroCopy:
      args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableZeroCopy;
      break;
  }
  args.device = device.pjrt_device();
  args.memory = device.default_memory();
  return args;
}

// The two events of a put through the plugin, owned by whoever holds this until each is awaited,
// destroyed or handed to OnEventReady.
struct PluginPutEvents {
  // The plugin has let go of the source.
  PJRT_Event* done_with_host_buffer = nullptr;
  // The buffer is ready; null when the plugin gave none, with its error in `ready_status`.
  PJRT_Event* ready = nullptr;
  Status ready_status;
};

// The events of the put `put` made, taken over from the plugin.
PluginPutEvents TakePutEvents(const PjrtRuntime& runtime,
                              const PJRT_Client_BufferFromHostBuffer_Args& put,
                              std::string_view tensor_name) {
  auto ready_args = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready_args.buffer = put.buffer;
  // When the plugin gives no ready event, its error is the buffer's readiness: a null event
  // would read as ready (OnEventReady and AwaitEvent take null for "nothing to wait for").
  Status ready_status = runtime.Check(runtime.api().PJRT_Buffer_ReadyEvent(&ready_args),
                                      fmt::format("tensor '{}': Buffer_ReadyEvent", tensor_name));
  PJRT_Event* ready = ready_status.ok() ? ready_args.event : nullptr;
  return PluginPutEvents{put.done_with_host_buffer, ready, std::move(ready_status)};
}

// kImmutableOnlyDuringCall: runs on_done on this thread once the plugin has let go of the
// source, then waits for the buffer to be ready. Takes over both events. PJRT promises the plugin
// has let go when the call returns; its event is waited for anyway (a plugin that breaks the
// promise costs a wait, not a use-after-free).
Status AwaitPluginPut(const PJRT_Api& api, PluginPutEvents events, OnDoneWithHostBuffer on_done,
                      std::string_view tensor_name) {
  Status read = AwaitEvent(api, events.done_with_host_buffer, "done_with_host_buffer");
  Status result = !read.ok() ? (DestroyEvent(api, events.ready), read)
                  : !events.ready_status.ok()
                      ? events.ready_status
                      : AwaitEvent(api, events.ready, fmt::format("tensor '{}'", tensor_name));
  // A call that fails does not call on_done (client.h): it is dropped, its source the caller's.
  if (result.ok() && on_done) std::move(on_done)();
  return result;
}

// An aliasing put: on_done runs when the plugin lets go of the memory, at PJRT_Buffer_Destroy
// (from the plugin's thread); `ready` is the buffer's own readiness, set before `token` is
// released. Takes over both events.
void CompleteAliasingPut(const PJRT_Api& api, PluginPutEvents events, OnDoneWithHostBuffer on_done,
                         const Promise<>& ready, ClientLifetime::Token token,
                         std::string_view tensor_name) {
  OnEventReady(
      api, events.done_with_host_buffer,
      [on_done = std::move(on_done)](Status) mutable {
        if (on_done) std::move(on_done)();
      },
      "done_with_host_buffer");
  auto set_ready = [ready, token = std::move(token)](Status status) mutable {
    ready.Set(std::move(status));  // before the token: the client waits for both
    token.Release();
  };
  if (events.ready_status.ok()) {
    OnEventReady(api, events.ready, std::move(set_ready), fmt::format("tensor '{}'", tensor_name));
  } else {
    set_ready(events.ready_status);
  }
}

// A copying put: `ready` completes once the data has arrived and on_done has returned, then
// `token` is released. on_done runs on a runtime thread, never inside BufferFromHostBuffer (see
// below), as kImmutableUntilTransferCompletes promises. Takes over both events; `device` outlives
// them (its client's destructor waits for the token).
void CompleteCopyingPut(const PjrtDevice& device, const PJRT_Api& api, PluginPutEvents events,
                        OnDoneWithHostBuffer on_done, const Promise<>& ready,
                        ClientLifetime::Token token, std::string_view tensor_name) {
  auto counter =
      std::make_shared<PieceCounter>([ready, token = std::move(token)](Status status) mutable {
        ready.Set(std::move(status));  // before the token: the client waits for both
        token.Release();
      });
  counter->Add();
  // The plugins copy small (0.81) or all (0.115) sources during the call, so their event is
  // ready at once and its continuation would run here, inside BufferFromHostBuffer: on_done
  // then goes to the device's host-to-device staging worker, a runtime thread, as
  // kImmutableUntilTransferCompletes promises.
  auto release_source = [counter, on_done = std::move(on_done)](Status status) mutable {
    if (on_done) {
      OnDoneWithHostBuffer release = std::move(on_done);
      std::move(release)();
    }
    counter->Done(std::move(status));
  };
  OnEventReady(
      api, events.done_with_host_buffer,
      [device = &device, caller = std::this_thread::get_id(),
       release_source = std::move(release_source)](Status status) mutable {
        if (std::this_thread::get_id() != caller) {
          std::move(release_source)(std::move(status));
          return;
        }
        auto deferred = std::make_shared<decltype(release_source)>(std::move(release_source));
        Status queued = device->RunOnStagingWorker(
            StagingDirection::kHostToDevice,
            [deferred, status](Status) mutable { std::move (*deferred)(std::move(status)); });
        // Only a closing client refuses: then run it here rather than never.
        if (!queued.ok()) std::move (*deferred)(std::move(status));
      },
      "done_with_host_buffer");
  counter->Add();
  OnEventReady(
      api, events.ready, [counter](Status status) { counter->Done(std::move(status)); },
      fmt::format("tensor '{}'", tensor_name));
  counter->Done(events.ready_status);
}

}  // namespace

std::byte* PjrtClient::HostAddressOf(PJRT_Buffer* buffer) const {
  if (!platform_.buffers_on_cpu ||
      !FERRY_PJRT_HAS(runtime_->library(), PJRT_Buffer_OpaqueDeviceMemoryDataPointer)) {
    return nullptr;
  }
  auto pointer = FERRY_PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
  pointer.buffer = buffer;
  const Status status = runtime_->Check(
      runtime_->api().PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&pointer), "pointer");
  return status.ok() ? static_cast<std::byte*>(pointer.device_memory_ptr) : nullptr;
}

StatusOr<std::unique_ptr<Buffer>> PjrtClient::PutThroughPlugin(const HostView& src,
                                                               PjrtDevice* device,
                                                               HostBufferSemantics semantics,
                                                               OnDoneWithHostBuffer on_done,
                                                               std::string_view tensor_name) {
  const PJRT_Api& api = runtime_->api();
  FERRY_ASSIGN_OR_RETURN(
      ClientLifetime::Token token,
      ClientLifetime::Begin(runtime_->lifetime(), fmt::format("tensor '{}'", tensor_name)));
  const bool zero_copy = semantics == HostBufferSemantics::kImmutableZeroCopy;
  const int64_t device_bytes = src.dense_size_bytes();
  std::shared_ptr<AccountedBytes> accounted;
  if (!zero_copy) {
    FERRY_RETURN_IF_ERROR(device->memory()->Reserve(device_bytes, tensor_name, device->name()));
    accounted = std::make_shared<AccountedBytes>(device->memory(), device_bytes);
  }
  auto args = PluginPutArgs(runtime_->client(), src, *device, semantics);
  FERRY_RETURN_IF_ERROR(runtime_->Check(api.PJRT_Client_BufferFromHostBuffer(&args),
                                        "tensor '{}': BufferFromHostBuffer on {}", tensor_name,
                                        device->name()));
  auto handle = std::make_shared<PjrtBufferHandle>(runtime_, args.buffer);

  PjrtBufferParts parts;
  parts.handle = handle;
  parts.device_dtype = src.dtype;
  parts.dims = src.dims;
  std::byte* device_pointer = HostAddressOf(args.buffer);
  parts.is_alias = zero_copy && device_pointer != nullptr && device_pointer == src.data;
  if (zero_copy && !parts.is_alias) {
    // The plugin copied where it was allowed to alias: the copy holds device memory like any
    // other, and the put is a fallback. Over the limit the call fails as a copy would, and
    // on_done never runs: the buffer goes, and the source is the caller's again once the plugin
    // has let go of it.
    if (Status reserved = device->memory()->Reserve(device_bytes, tensor_name, device->name());
        !reserved.ok()) {
      parts.handle.reset();
      handle.reset();
      AwaitEvent(api, args.done_with_host_buffer, "done_with_host_buffer").IgnoreError();
      return reserved;
    }
    accounted = std::make_shared<AccountedBytes>(device->memory(), device_bytes);
    metrics::ZeroCopyFallbacks()->Add();
  }
  parts.memory_keepalive = accounted;
  // ferry reads the plugin's memory itself only where it may (direct host access), or where it
  // is the caller's own memory (an alias): the plugin's events can complete before its copies
  // have landed (see PjrtBuffer::ToHost), and its own reads are ordered after them.
  parts.host_address = platform_.direct_host_access || parts.is_alias ? device_pointer : nullptr;
  if (parts.is_alias) metrics::ZeroCopyAliases()->Add();

  PluginPutEvents events = TakePutEvents(*runtime_, args, tensor_name);
  if (semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
    FERRY_RETURN_IF_ERROR(AwaitPluginPut(api, std::move(events), std::move(on_done), tensor_name));
    parts.ready = Future<>::Ready(OkStatus());
    return std::unique_ptr<Buffer>(new PjrtBuffer(device, std::move(parts)));
  }
  Promise<> ready;
  parts.ready = ready.future();
  if (parts.is_alias) {
    CompleteAliasingPut(api, std::move(events), std::move(on_done), ready, std::move(token),
                        tensor_name);
  } else {
    CompleteCopyingPut(*device, api, std::move(events), std::move(on_done), ready, std::move(token),
                       tensor_name);
  }
  return std::unique_ptr<Buffer>(new PjrtBuffer(device, std::move(parts)));
}

namespace {

struct ViewDeleteContext {
  std::shared_ptr<DeviceAllocation> allocation;
};

void GiveBackViewMemory(void* /*device_buffer_ptr*/, void* user_arg) {
  TakeBackFromPlugin(user_arg);
  delete static_cast<ViewDeleteContext*>(user_arg);
}

}  // namespace

StatusOr<std::unique_ptr<Buffer>> PjrtClient::PutDirect(const HostView& src, DType device_dtype,
                                                        PjrtDevice* device,
                                                        HostBufferSemantics semantics,
                                                        OnDoneWithHostBuffer on_done,
                                                        std::string_view tensor_name) {
  const PJRT_Api& api = runtime_->api();
  const int64_t device_bytes = src.num_elements() * DTypeSize(device_dtype);
  FERRY_ASSIGN_OR_RETURN(auto allocation, DeviceAllocation::Create(device->memory(), device_bytes,
                                                                   tensor_name, device->name()));
  FERRY_ASSIGN_OR_RETURN(
      CopyConvertPlan plan,
      CopyConvertPlan::Create(
          src, MutableHostView::Dense(allocation->mutable_data(), device_dtype, src.dims)));
  // The plugin's view of ferry's memory; on_delete gives the memory back when the plugin is done
  // with the buffer (a zero-sized allocation still has a valid, aligned pointer).
  alignas(64) static std::byte kEmpty[64] = {};
  void* memory = device_bytes > 0 ? static_cast<void*>(allocation->mutable_data()) : kEmpty;
  auto view = FERRY_PJRT_ARGS(PJRT_Client_CreateViewOfDeviceBuffer_Args);
  view.client = runtime_->client();
  view.device_buffer_ptr = memory;
  view.dims = src.dims.data();
  view.num_dims = src.dims.size();
  view.element_type = ToPjrtType(device_dtype);
  view.device = device->pjrt_device();
  view.memory = device->default_memory();
  view.on_delete_callback = &GiveBackViewMemory;
  auto context = std::make_unique<ViewDeleteContext>(ViewDeleteContext{allocation});
  view.on_delete_callback_arg = context.get();
  HandOffToPlugin(context.get());
  FERRY_RETURN_IF_ERROR(runtime_->Check(api.PJRT_Client_CreateViewOfDeviceBuffer(&view),
                                        "tensor '{}': CreateViewOfDeviceBuffer on {}", tensor_name,
                                        device->name()));
  context.release();  // the plugin owns it now, until on_delete
  (src.dtype == device_dtype ? metrics::DirectTransfers() : metrics::ConvertedTransfers())->Add();

  PjrtBufferParts parts;
  parts.handle = std::make_shared<PjrtBufferHandle>(runtime_, view.buffer);
  parts.device_dtype = device_dtype;
  parts.dims = src.dims;
  parts.host_address = device_bytes > 0 ? allocation->mutable_data() : nullptr;
  parts.memory_keepalive = allocation;
  // An asynchronous write holds a client token until its Ready(): the client's destructor waits
  // for it (the engine is the client's).
  std::shared_ptr<void> hold;
  if (semantics != HostBufferSemantics::kImmutableOnlyDuringCall) {
    FERRY_ASSIGN_OR_RETURN(
        ClientLifetime::Token token,
        ClientLifetime::Begin(runtime_->lifetime(), fmt::format("tensor '{}'", tensor_name)));
    hold = std::make_shared<ClientLifetime::Token>(std::move(token));
  }
  FERRY_ASSIGN_OR_RETURN(
      parts.ready, WriteThroughEngine(*engine_, std::move(plan), semantics, std::move(on_done),
                                      allocation, std::move(hold)));
  return std::unique_ptr<Buffer>(new PjrtBuffer(device, std::move(parts)));
}

namespace {

// Create-then-fill through the plugin's transfer manager: the buffer is the plugin's own from
// the start (RetrieveBuffer), each Write is one TransferData at its offset.
class PjrtBufferWriter final : public BufferWriter {
 public:
  PjrtBufferWriter(PjrtClient* client, PjrtDevice* device, DType device_dtype, const Dims& dims,
                   const WriterPlacement& placement, std::string_view tensor_name,
                   PJRT_AsyncHostToDeviceTransferManager* manager, PjrtBufferParts parts,
                   Promise<> ready, ClientLifetime::Token held)
      : BufferWriter(device_dtype, dims, placement.size_bytes, placement.memory.kind,
                     std::string(tensor_name)),
        device_(device),
        runtime_(client->runtime()),
        manager_(manager),
        parts_(std::move(parts)),
        ready_(std::move(ready)),
        held_(std::move(held)) {}

  ~PjrtBufferWriter() override {
    AbortIfUnfinished();
    const PJRT_Api& api = runtime_->api();
    auto args = FERRY_PJRT_ARGS(PJRT_AsyncHostToDeviceTransferManager_Destroy_Args);
    args.transfer_manager = manager_;
    ErrorToStatus(api, api.PJRT_AsyncHostToDeviceTransferManager_Destroy(&args), "Destroy")
        .IgnoreError();
  }

  void Start() { CompleteIfEmpty(); }

 protected:
  StatusOr<Future<>> WriteBytes(int64_t offset_bytes, const void* data, int64_t size_bytes,
                                bool last) override {
    // A writer started for an operation already in flight (PutStaged) writes as part of it, so
    // a client that is closing still takes its bytes; any other write is a new operation.
    ClientLifetime::Token token = held_.Share();
    if (!token.held()) {
      FERRY_ASSIGN_OR_RETURN(
          token, ClientLifetime::Begin(runtime_->lifetime(), fmt::format("tensor '{}'", name())));
    }
    const PJRT_Api& api = runtime_->api();
    alignas(64) static const std::byte kEmpty[64] = {};
    auto args = FERRY_PJRT_ARGS(PJRT_AsyncHostToDeviceTransferManager_TransferData_Args);
    args.transfer_manager = manager_;
    args.buffer_index = 0;
    args.data = size_bytes == 0 ? kEmpty : data;
    args.offset = offset_bytes;
    args.transfer_size = size_bytes;
    args.is_last_transfer = last;
    FERRY_RETURN_IF_ERROR(
        runtime_->Check(api.PJRT_AsyncHostToDeviceTransferManager_TransferData(&args),
                        "tensor '{}': TransferData", name()));
    Promise<> taken;
    OnEventReady(
        api, args.done_with_h2d_transfer, [taken](Status status) { taken.Set(std::move(status)); },
        name());
    if (last) {
      auto ready_args = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
      ready_args.buffer = parts_.handle->get();
      Status status = runtime_->Check(api.PJRT_Buffer_ReadyEvent(&ready_args), "ReadyEvent");
      if (!status.ok()) {
        ready_.Set(std::move(status));
      } else {
        OnEventReady(
            api, ready_args.event,
            [ready = ready_, token = std::move(token)](Status status) mutable {
              ready.Set(std::move(status));
              token.Release();
            },
            name());
      }
    }
    return taken.future();
  }

  void FailBuffer(Status status) override {
    const PJRT_Api& api = runtime_->api();
    if (FERRY_PJRT_HAS(runtime_->library(), PJRT_AsyncHostToDeviceTransferManager_SetBufferError)) {
      auto args = FERRY_PJRT_ARGS(PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args);
      args.transfer_manager = manager_;
      args.buffer_index = 0;
      args.error_code = PJRT_Error_Code_ABORTED;
      const std::string message(status.message());
      args.error_message = message.c_str();
      args.error_message_size = message.size();
      ErrorToStatus(api, api.PJRT_AsyncHostToDeviceTransferManager_SetBufferError(&args),
                    "SetBufferError")
          .IgnoreError();
    }
    ready_.Set(std::move(status));
  }

  std::unique_ptr<Buffer> MakeBuffer() override {
    auto buffer = std::unique_ptr<Buffer>(new PjrtBuffer(device_, parts_));
    // The buffer alone accounts for the device memory from here: dropping it releases the bytes
    // even while the writer still lives.
    parts_.memory_keepalive.reset();
    return buffer;
  }

 private:
  PjrtDevice* const device_;
  const std::shared_ptr<PjrtRuntime> runtime_;
  PJRT_AsyncHostToDeviceTransferManager* const manager_;
  PjrtBufferParts parts_;
  Promise<> ready_;
  const ClientLifetime::Token held_;
};

}  // namespace

StatusOr<std::unique_ptr<Buffer>> PjrtClient::PutStaged(const HostView& src, DType device_dtype,
                                                        PjrtDevice* device,
                                                        HostBufferSemantics semantics,
                                                        OnDoneWithHostBuffer on_done,
                                                        std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(
      CopyConvertPlan::Create(src, MutableHostView::Dense(nullptr, device_dtype, src.dims))
          .status());
  FERRY_ASSIGN_OR_RETURN(
      ClientLifetime::Token token,
      ClientLifetime::Begin(runtime_->lifetime(), fmt::format("tensor '{}'", tensor_name)));
  // The buffer is ready once the plugin has the bytes and `on_done` has returned.
  Promise<> released;
  ClientLifetime::Token writer_token = token.Share();
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<BufferWriter> started,
                         StartWriter(device_dtype, src.dims, device, /*memory_kind=*/"",
                                     tensor_name, released.future(), std::move(writer_token)));
  std::shared_ptr<BufferWriter> writer = std::move(started);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  metrics::ConvertedTransfers()->Add();

  // Streams every chunk through the device's host-to-device staging ring (waiting for free
  // chunks) into the writer: one TransferData per chunk, at its offset. A failure ends the fill
  // with its error, so that nothing waits for bytes that will never come.
  auto write_all = [device, src, device_dtype,
                    writer](const std::shared_ptr<PieceCounter>& counter) -> Status {
    Status result = StagedWrite(
        device->staging(StagingDirection::kHostToDevice), src, device_dtype,
        [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone done) -> Status {
          if (piece.size_bytes == 0) {  // an empty tensor: the writer completed it at its start
            std::move(done)(OkStatus());
          } else {
            writer->Write(piece.offset_bytes, chunk.host, piece.size_bytes)
                .OnReady(std::move(done));
          }
          return OkStatus();
        },
        counter);
    if (!result.ok()) writer->Abort(result);
    return result;
  };
  // Runs once every chunk has been taken by the plugin (or the fill failed).
  // A put that fails inside the call (kImmutableOnlyDuringCall) drops on_done without calling it
  // (client.h); an asynchronous one has returned, and runs it whatever the outcome.
  const bool failure_fails_the_call = semantics == HostBufferSemantics::kImmutableOnlyDuringCall;
  auto finish = [released, on_done = std::move(on_done), failure_fails_the_call,
                 token = std::move(token)](Status status) mutable {
    if (on_done) {
      OnDoneWithHostBuffer release = std::move(on_done);
      if (status.ok() || !failure_fails_the_call) std::move(release)();
    }
    released.Set(std::move(status));
    token.Release();
  };

  if (semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
    Promise<> written;
    auto counter = std::make_shared<PieceCounter>(
        [written](Status status) { written.Set(std::move(status)); });
    counter->Done(write_all(counter));
    Status status = written.future().Await();
    finish(status);
    FERRY_RETURN_IF_ERROR(status);
    return buffer;
  }
  // The worker owns the rest: the staging (which may wait for chunks) and the completion.
  auto job = [write_all, finish = std::move(finish), writer](Status start) mutable {
    if (!start.ok()) {
      writer->Abort(start);
      std::move(finish)(std::move(start));
      return;
    }
    // The counter starts with this job's own piece, so it cannot finish before every chunk has
    // been handed to the plugin.
    auto counter = std::make_shared<PieceCounter>(std::move(finish));
    counter->Done(write_all(counter));
  };
  FERRY_RETURN_IF_ERROR(
      device->RunOnStagingWorker(StagingDirection::kHostToDevice, std::move(job)));
  return buffer;
}

StatusOr<std::unique_ptr<BufferWriter>> PjrtClient::CreateBufferWriter(
    DType device_dtype, const Dims& dims, Device* device, std::string_view memory_kind,
    std::string_view tensor_name) {
  return StartWriter(device_dtype, dims, device, memory_kind, tensor_name, std::nullopt,
                     ClientLifetime::Token());
}

StatusOr<std::unique_ptr<BufferWriter>> PjrtClient::StartWriter(
    DType device_dtype, const Dims& dims, Device* device, std::string_view memory_kind,
    std::string_view tensor_name, std::optional<Future<>> also_wait_for,
    ClientLifetime::Token held) {
  FERRY_ASSIGN_OR_RETURN(
      const WriterPlacement placement,
      CheckCreateBufferWriterArgs(*this, device_dtype, dims, device, memory_kind, tensor_name));
  auto* pjrt_device = static_cast<PjrtDevice*>(device);
  PJRT_Memory* memory = pjrt_device->FindMemory(placement.memory.kind);
  if (!platform_.has_transfer_manager || memory == nullptr) {
    return UnimplementedError(fmt::format(
        "tensor '{}': create-then-fill on {} needs the plugin's transfer manager and memories "
        "(PJRT API 0.5x+), which {} lacks",
        tensor_name, device->name(), platform_.plugin_path));
  }
  if (!platform_.row_major_layouts) {
    // Each write lands at a byte offset of the dense row-major array, which a tiled device
    // layout does not have.
    return UnimplementedError(fmt::format(
        "tensor '{}': create-then-fill on {} writes at byte offsets of a row-major array, and "
        "the plugin does not lay its buffers out that way (its tiled or reordered layouts need "
        "the whole tensor at once: put it into the default memory)",
        tensor_name, device->name()));
  }
  FERRY_ASSIGN_OR_RETURN(
      ClientLifetime::Token token,
      ClientLifetime::Begin(runtime_->lifetime(), fmt::format("tensor '{}'", tensor_name)));
  FERRY_RETURN_IF_ERROR(
      pjrt_device->memory()->Reserve(placement.size_bytes, tensor_name, device->name()));
  auto accounted = std::make_shared<AccountedBytes>(pjrt_device->memory(), placement.size_bytes);
  const PJRT_Api& api = runtime_->api();
  PJRT_ShapeSpec spec{};
  spec.struct_size = PJRT_ShapeSpec_STRUCT_SIZE;
  spec.dims = dims.data();
  spec.num_dims = dims.size();
  spec.element_type = ToPjrtType(device_dtype);
  auto create = FERRY_PJRT_ARGS(PJRT_Client_CreateBuffersForAsyncHostToDevice_Args);
  create.client = runtime_->client();
  create.shape_specs = &spec;
  create.num_shape_specs = 1;
  create.memory = memory;
  FERRY_RETURN_IF_ERROR(
      runtime_->Check(api.PJRT_Client_CreateBuffersForAsyncHostToDevice(&create),
                      fmt::format("tensor '{}': CreateBuffersForAsyncHostToDevice on {}",
                                  tensor_name, device->name())));
  auto retrieve = FERRY_PJRT_ARGS(PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args);
  retrieve.transfer_manager = create.transfer_manager;
  retrieve.buffer_index = 0;
  if (Status status = runtime_->Check(
          api.PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer(&retrieve), "RetrieveBuffer");
      !status.ok()) {
    auto args = FERRY_PJRT_ARGS(PJRT_AsyncHostToDeviceTransferManager_Destroy_Args);
    args.transfer_manager = create.transfer_manager;
    ErrorToStatus(api, api.PJRT_AsyncHostToDeviceTransferManager_Destroy(&args), "Destroy")
        .IgnoreError();
    return status;
  }
  token.Release();
  Promise<> ready;
  PjrtBufferParts parts;
  parts.handle = std::make_shared<PjrtBufferHandle>(runtime_, retrieve.buffer_out);
  parts.device_dtype = device_dtype;
  parts.dims = dims;
  parts.ready =
      also_wait_for.has_value() ? JoinFutures({ready.future(), *also_wait_for}) : ready.future();
  parts.memory_keepalive = accounted;
  parts.memory_kind = placement.memory.kind;
  auto writer = std::make_unique<PjrtBufferWriter>(
      this, pjrt_device, device_dtype, dims, placement, tensor_name, create.transfer_manager,
      std::move(parts), std::move(ready), std::move(held));
  writer->Start();
  return std::unique_ptr<BufferWriter>(std::move(writer));
}

}  // namespace ferry::pjrt
