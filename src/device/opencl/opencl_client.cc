#include "src/device/opencl/opencl_client.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>

#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/background_executor.h"
#include "src/device/opencl/opencl_status.h"

namespace ferry::opencl {
namespace {

constexpr cl_int kPlatformNotFound = -1001;  // CL_PLATFORM_NOT_FOUND_KHR (cl_ext.h)

template <typename Info, typename Object, typename Param>
StatusOr<std::string> GetInfoString(Info info, Object object, Param param, std::string_view call,
                                    std::string_view what) {
  size_t size = 0;
  FERRY_OPENCL_RETURN_IF_ERROR(info(object, param, 0, nullptr, &size), call, what);
  std::string text(size, '\0');
  if (size > 0) {
    FERRY_OPENCL_RETURN_IF_ERROR(info(object, param, size, text.data(), nullptr), call, what);
  }
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

template <typename T>
StatusOr<T> GetDeviceValue(const OpenClLibrary& cl, cl_device_id device, cl_device_info param,
                           std::string_view what) {
  T value{};
  FERRY_OPENCL_RETURN_IF_ERROR(cl.clGetDeviceInfo(device, param, sizeof(value), &value, nullptr),
                               "clGetDeviceInfo", what);
  return value;
}

// How much freed device memory a device keeps for reuse (DeviceQueue's cache): a quarter of its
// global memory, at most 2 GiB, so the cache never crowds out the tensors themselves.
int64_t MemoryCacheLimitBytes(int64_t global_memory_bytes) {
  return std::min<int64_t>(global_memory_bytes / 4, int64_t{2} << 30);
}

bool HasExtension(const std::string& extensions, std::string_view name) {
  std::istringstream words(extensions);
  std::string word;
  while (words >> word) {
    if (word == name) return true;
  }
  return false;
}

StatusOr<OpenClDeviceInfo> ReadDeviceInfo(const OpenClLibrary& cl, cl_platform_id platform,
                                          cl_device_id device, std::string_view what) {
  OpenClDeviceInfo info;
  FERRY_ASSIGN_OR_RETURN(std::string device_name,
                         GetInfoString(cl.clGetDeviceInfo, device, CL_DEVICE_NAME,
                                       "clGetDeviceInfo(CL_DEVICE_NAME)", what));
  FERRY_ASSIGN_OR_RETURN(std::string version,
                         GetInfoString(cl.clGetDeviceInfo, device, CL_DEVICE_VERSION,
                                       "clGetDeviceInfo(CL_DEVICE_VERSION)", what));
  FERRY_ASSIGN_OR_RETURN(std::string extensions,
                         GetInfoString(cl.clGetDeviceInfo, device, CL_DEVICE_EXTENSIONS,
                                       "clGetDeviceInfo(CL_DEVICE_EXTENSIONS)", what));
  FERRY_ASSIGN_OR_RETURN(std::string platform_name,
                         GetInfoString(cl.clGetPlatformInfo, platform, CL_PLATFORM_NAME,
                                       "clGetPlatformInfo(CL_PLATFORM_NAME)", what));
  // "OpenCL <major>.<minor> <vendor-specific>"
  int major = 0;
  int minor = 0;
  if (std::sscanf(version.c_str(), "OpenCL %d.%d", &major, &minor) != 2) {
    return UnavailableError(
        fmt::format("{} reports an unparsable version '{}'", device_name, version));
  }
  if (major < 1 || (major == 1 && minor < 1)) {
    return UnavailableError(
        fmt::format("{} implements {}; ferry needs OpenCL 1.1 (user events, rectangular copies)",
                    device_name, version));
  }
  info.description = fmt::format("{} ({}, {})", device_name, platform_name, version);
  info.opencl_1x = major < 2;
  info.has_fp64 = HasExtension(extensions, "cl_khr_fp64");
  info.has_fp16 = HasExtension(extensions, "cl_khr_fp16");
  FERRY_ASSIGN_OR_RETURN(cl_ulong global_memory,
                         GetDeviceValue<cl_ulong>(cl, device, CL_DEVICE_GLOBAL_MEM_SIZE, what));
  FERRY_ASSIGN_OR_RETURN(cl_ulong max_allocation,
                         GetDeviceValue<cl_ulong>(cl, device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, what));
  FERRY_ASSIGN_OR_RETURN(cl_device_type type,
                         GetDeviceValue<cl_device_type>(cl, device, CL_DEVICE_TYPE, what));
  info.is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  constexpr cl_ulong kInt64Max = static_cast<cl_ulong>(INT64_MAX);
  info.global_memory_bytes = static_cast<int64_t>(std::min(global_memory, kInt64Max));
  info.max_allocation_bytes = static_cast<int64_t>(std::min(max_allocation, kInt64Max));
  return info;
}

// The profile read from the device, narrowed by the caller's `requested` one.
DeviceCapabilities MakeCapabilities(const OpenClDeviceInfo& info,
                                    const std::optional<DeviceCapabilities>& requested) {
  DeviceCapabilities capabilities = DeviceCapabilities::All();
  if (!info.has_fp64) {
    capabilities.dtypes.reset(static_cast<size_t>(DType::kF64));
    capabilities.dtypes.reset(static_cast<size_t>(DType::kC128));
  }
  if (!info.has_fp16) capabilities.dtypes.reset(static_cast<size_t>(DType::kF16));
  capabilities.memory_limit_bytes = info.global_memory_bytes;
  capabilities.max_buffer_bytes = info.max_allocation_bytes;
  if (requested.has_value()) {
    capabilities.dtypes &= requested->dtypes;
    if (requested->memory_limit_bytes.has_value()) {
      capabilities.memory_limit_bytes =
          std::min(*capabilities.memory_limit_bytes, *requested->memory_limit_bytes);
    }
    if (requested->max_buffer_bytes.has_value()) {
      capabilities.max_buffer_bytes =
          std::min(*capabilities.max_buffer_bytes, *requested->max_buffer_bytes);
    }
  }
  return capabilities;
}

// Every (platform, device) pair, in platform order. Unavailable when there are none.
StatusOr<std::vector<std::pair<cl_platform_id, cl_device_id>>> ListDevices(
    const OpenClLibrary& cl) {
  cl_uint num_platforms = 0;
  cl_int error = cl.clGetPlatformIDs(0, nullptr, &num_platforms);
  if (error == kPlatformNotFound || (error == CL_SUCCESS && num_platforms == 0)) {
    return UnavailableError(fmt::format(
        "no OpenCL platform: the ICD loader {} found no OpenCL driver (install one, such as "
        "pocl-opencl-icd, and check /etc/OpenCL/vendors)",
        cl.name));
  }
  FERRY_OPENCL_RETURN_IF_ERROR(error, "clGetPlatformIDs", "the OpenCL platforms");
  std::vector<cl_platform_id> platforms(num_platforms);
  FERRY_OPENCL_RETURN_IF_ERROR(cl.clGetPlatformIDs(num_platforms, platforms.data(), nullptr),
                               "clGetPlatformIDs", "the OpenCL platforms");
  std::vector<std::pair<cl_platform_id, cl_device_id>> devices;
  std::vector<std::string> platform_names;
  for (cl_platform_id platform : platforms) {
    StatusOr<std::string> name =
        GetInfoString(cl.clGetPlatformInfo, platform, CL_PLATFORM_NAME,
                      "clGetPlatformInfo(CL_PLATFORM_NAME)", "an OpenCL platform");
    platform_names.push_back(name.ok() ? *name : "(unnamed)");
    cl_uint num_devices = 0;
    error = cl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 0, nullptr, &num_devices);
    if (error == CL_DEVICE_NOT_FOUND || num_devices == 0) continue;
    FERRY_OPENCL_RETURN_IF_ERROR(error, "clGetDeviceIDs", platform_names.back());
    std::vector<cl_device_id> ids(num_devices);
    FERRY_OPENCL_RETURN_IF_ERROR(
        cl.clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, num_devices, ids.data(), nullptr),
        "clGetDeviceIDs", platform_names.back());
    for (cl_device_id id : ids) devices.emplace_back(platform, id);
  }
  if (devices.empty()) {
    return UnavailableError(fmt::format("no OpenCL device on {} platform(s): {}", platforms.size(),
                                        fmt::join(platform_names, ", ")));
  }
  return devices;
}

// What runs once the last piece of a write is done: the caller's on_done (if it has not run on
// the caller's thread already), then Ready(). The callback object is gone before Ready().
absl::AnyInvocable<void(Status) &&> FinishWrite(OnDoneWithHostBuffer on_done, Promise<> ready) {
  return [on_done = std::move(on_done), ready = std::move(ready)](Status status) mutable {
    if (on_done) {
      std::move(on_done)();
      on_done = nullptr;
    }
    ready.Set(std::move(status));
  };
}

// One host -> device write, as the paths below see it.
struct Write {
  const DeviceQueue& queue;
  const DeviceMemory& memory;
  const HostView& src;
  DType device_dtype;
  const std::string& what;
};

// Enqueues the direct write of `write.src` (a kDense or kRect path) from the caller's memory,
// after `wait` when given.
StatusOr<cl_event> EnqueueDirectWrite(const Write& write, const TransferPath& path,
                                      const cl_event* wait) {
  const OpenClLibrary& cl = write.queue.cl();
  cl_event event = nullptr;
  if (path.kind == PathKind::kDense) {
    FERRY_OPENCL_RETURN_IF_ERROR(
        cl.clEnqueueWriteBuffer(write.queue.queue(), write.memory.mem(), CL_FALSE, 0,
                                static_cast<size_t>(write.memory.size_bytes()), write.src.data,
                                wait != nullptr ? 1 : 0, wait, &event),
        "clEnqueueWriteBuffer", write.what);
    return event;
  }
  const RectLayout& rect = path.rect;
  const size_t origin[3] = {0, 0, 0};
  FERRY_OPENCL_RETURN_IF_ERROR(
      cl.clEnqueueWriteBufferRect(
          write.queue.queue(), write.memory.mem(), CL_FALSE, origin, origin, rect.region.data(),
          rect.region[0], rect.region[0] * rect.region[1], rect.host_row_pitch,
          rect.host_slice_pitch, write.src.data, wait != nullptr ? 1 : 0, wait, &event),
      "clEnqueueWriteBufferRect", write.what);
  return event;
}

// Small sources go through a block of ferry's own, copied now, so that this call never waits
// (not for the device, not for a staging chunk) and kImmutableOnlyDuringCall is done with the
// source at once. The block lives until the write has read it.
Status WriteFromOwnBlock(const Write& write, bool only_during_call, OnDoneWithHostBuffer on_done,
                         const Promise<>& ready, ClientLifetime::Token token) {
  const OpenClLibrary& cl = write.queue.cl();
  const int64_t device_bytes = write.memory.size_bytes();
  FERRY_ASSIGN_OR_RETURN(HostBlock block, AllocateHostBlock(device_bytes, write.what));
  FERRY_RETURN_IF_ERROR(CopyConvert(
      write.src, MutableHostView::Dense(block.get(), write.device_dtype, write.src.dims)));
  metrics::StagingBytes()->Add(device_bytes);
  std::optional<EventGate> gate;
  if (!only_during_call) {
    FERRY_ASSIGN_OR_RETURN(EventGate created, EventGate::Create(write.queue, write.what));
    gate.emplace(std::move(created));
  }
  cl_event event = nullptr;
  FERRY_OPENCL_RETURN_IF_ERROR(
      cl.clEnqueueWriteBuffer(write.queue.queue(), write.memory.mem(), CL_FALSE, 0,
                              static_cast<size_t>(device_bytes), block.get(), gate ? 1 : 0,
                              gate ? gate->event() : nullptr, &event),
      "clEnqueueWriteBuffer", write.what);
  if (only_during_call && on_done) {
    std::move(on_done)();
    on_done = nullptr;
  }
  auto counter =
      std::make_shared<PieceCounter>(FinishWrite(std::move(on_done), ready), std::move(token));
  // The write is the counter's one piece.
  OnEventComplete(
      cl, event,
      [counter, block = std::move(block), what = write.what](cl_int status) mutable {
        block.reset();
        counter->Done(EventStatus(status, "write", what));
      },
      gate ? &*gate : nullptr);
  if (gate) gate->Open();
  cl.clFlush(write.queue.queue());
  return OkStatus();
}

// kImmutableOnlyDuringCall from the caller's memory: the write is waited for here, so the source
// is free, on_done has run and Ready() has completed when this returns. It needs no client
// token: nothing of this write outlives the call.
Status WriteDirectAndWait(const Write& write, const TransferPath& path,
                          OnDoneWithHostBuffer on_done, const Promise<>& ready) {
  const OpenClLibrary& cl = write.queue.cl();
  FERRY_ASSIGN_OR_RETURN(cl_event event, EnqueueDirectWrite(write, path, nullptr));
  cl.clFlush(write.queue.queue());
  FERRY_OPENCL_RETURN_IF_ERROR(WaitForEvent(cl, event), "writing (waited for)", write.what);
  if (on_done) std::move(on_done)();
  on_done = nullptr;
  ready.Set(OkStatus());
  return OkStatus();
}

// An asynchronous write from the caller's memory; on_done and Ready() come from its event
// callback. The gate keeps the write from completing before its callback is registered: on_done
// must not run on this thread, inside this call.
Status WriteDirectBehindGate(const Write& write, const TransferPath& path,
                             OnDoneWithHostBuffer on_done, const Promise<>& ready,
                             ClientLifetime::Token token) {
  const OpenClLibrary& cl = write.queue.cl();
  FERRY_ASSIGN_OR_RETURN(EventGate gate, EventGate::Create(write.queue, write.what));
  FERRY_ASSIGN_OR_RETURN(cl_event event, EnqueueDirectWrite(write, path, gate.event()));
  auto counter =
      std::make_shared<PieceCounter>(FinishWrite(std::move(on_done), ready), std::move(token));
  OnEventComplete(
      cl, event,
      [counter, what = write.what](cl_int status) {
        counter->Done(EventStatus(status, "write", what));
      },
      &gate);
  gate.Open();
  cl.clFlush(write.queue.queue());
  return OkStatus();
}

// kImmutableOnlyDuringCall through the staging ring, on this thread (the call may wait for
// chunks): on_done runs here once the source has been read, Ready() once the last chunk has
// arrived.
Status StageOnCallingThread(StagingRing& ring, const Write& write, OnDoneWithHostBuffer on_done,
                            const Promise<>& ready, ClientLifetime::Token token) {
  auto counter = std::make_shared<PieceCounter>(FinishWrite(nullptr, ready), std::move(token));
  Status staged =
      StagedWrite(ring, write.src, write.device_dtype, write.memory, counter, write.what);
  if (!staged.ok()) {
    counter->Done(staged);  // chunks in flight finish on their own
    return staged;
  }
  if (on_done) std::move(on_done)();
  on_done = nullptr;
  counter->Done(OkStatus());
  return OkStatus();
}

// Staged on the ring's worker: this call returns at once, with the future of the chunks having
// been enqueued. The job holds the device memory only until its chunks are enqueued (they keep
// the cl_mem alive on their own): when its Done is the last piece, on_done runs from it, and a
// caller woken by on_done that drops the buffer must find the memory given back.
StatusOr<Future<>> StageOnRingWorker(StagingRing& ring, std::shared_ptr<DeviceMemory> memory,
                                     const HostView& src, DType device_dtype,
                                     const std::string& what, OnDoneWithHostBuffer on_done,
                                     const Promise<>& ready, ClientLifetime::Token token) {
  auto counter =
      std::make_shared<PieceCounter>(FinishWrite(std::move(on_done), ready), std::move(token));
  Promise<> enqueued;
  FERRY_RETURN_IF_ERROR(ring.Submit([counter, memory = std::move(memory), src, device_dtype,
                                     ring = &ring, enqueued, what](Status status) mutable {
    if (status.ok()) status = StagedWrite(*ring, src, device_dtype, *memory, counter, what);
    memory.reset();
    enqueued.Set(status);
    counter->Done(std::move(status));
  }));
  return enqueued.future();
}

}  // namespace

OpenClDevice::OpenClDevice(OpenClClient* client, int index, OpenClDeviceInfo info,
                           DeviceCapabilities capabilities, std::shared_ptr<DeviceQueue> queue)
    : client_(client),
      index_(index),
      name_(fmt::format("opencl:{}", index)),
      info_(std::move(info)),
      capabilities_(std::move(capabilities)),
      queue_(std::move(queue)),
      memory_(std::make_shared<MemoryAccount>(capabilities_.memory_limit_bytes)),
      ring_(MakeStagingRing(*queue_)) {}

Client* OpenClDevice::client() const { return client_; }

StatusOr<NativeDeviceHandles> OpenClDevice::NativeHandles() const {
  NativeDeviceHandles handles;
  handles.backend = "opencl";
  handles.library = queue_->cl().name;
  handles.client = queue_->context();
  handles.device = queue_->device();
  handles.queue = queue_->queue();
  handles.memory_on_host = info_.is_cpu;
  return handles;
}

void OpenClDevice::ShutdownStaging() { ring_->Shutdown(); }

void OpenClDevice::FinishQueue() { queue_->cl().clFinish(queue_->queue()); }

StatusOr<std::unique_ptr<Client>> OpenClClient::Create(const ClientOptions& options) {
  StatusOr<const OpenClLibrary*> library = options.opencl_library.has_value()
                                               ? LoadOpenClLibrary(*options.opencl_library)
                                               : LoadDefaultOpenClLibrary();
  if (!library.ok()) {
    return UnavailableError(fmt::format("the opencl backend is unavailable: {}",
                                        std::string(library.status().message())));
  }
  const OpenClLibrary* cl = *library;
  StatusOr<std::vector<std::pair<cl_platform_id, cl_device_id>>> devices = ListDevices(*cl);
  if (!devices.ok()) {
    // A driver that fails to list its devices is as good as none: the rest of ferry goes on.
    return UnavailableError(fmt::format("the opencl backend is unavailable: {}",
                                        std::string(devices.status().message())));
  }
  std::unique_ptr<OpenClClient> client(new OpenClClient());
  for (const auto& [platform, device] : *devices) {
    const int index = static_cast<int>(client->devices_.size());
    const std::string name = fmt::format("opencl:{}", index);
    StatusOr<OpenClDeviceInfo> info = ReadDeviceInfo(*cl, platform, device, name);
    StatusOr<std::shared_ptr<DeviceQueue>> queue =
        info.ok() ? DeviceQueue::Create(*cl, device, info->opencl_1x, name,
                                        MemoryCacheLimitBytes(info->global_memory_bytes))
                  : StatusOr<std::shared_ptr<DeviceQueue>>(info.status());
    if (!queue.ok()) {
      return UnavailableError(fmt::format("the opencl backend is unavailable: {}",
                                          std::string(queue.status().message())));
    }
    DeviceCapabilities capabilities = MakeCapabilities(*info, options.capabilities);
    client->devices_.push_back(std::make_unique<OpenClDevice>(
        client.get(), index, *std::move(info), std::move(capabilities), *std::move(queue)));
    client->device_pointers_.push_back(client->devices_.back().get());
  }
  return std::unique_ptr<Client>(std::move(client));
}

OpenClClient::~OpenClClient() {
  // No operation starts from here on; queued staged transfers complete with Cancelled (their
  // on_done runs here), the running ones finish enqueueing.
  lifetime_->Close();
  for (auto& device : devices_) device->ShutdownStaging();
  // Every enqueued command completes; then every event callback has returned (the tokens).
  for (auto& device : devices_) device->FinishQueue();
  lifetime_->WaitUntilIdle();
  // Now no callback can touch a ring: unmap and free the staging chunks on this thread. Freed
  // device memory is released; buffers that outlive the client release theirs when they die.
  for (auto& device : devices_) {
    device->DestroyRing();
    device->queue()->CloseCache();
  }
}

StatusOr<std::unique_ptr<Buffer>> OpenClClient::BufferFromHostBuffer(
    const HostView& src, DType device_dtype, Device* device, HostBufferSemantics semantics,
    OnDoneWithHostBuffer on_done, std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(
      CheckBufferFromHostBufferArgs(*this, src, device_dtype, device, tensor_name));
  auto* opencl_device = static_cast<OpenClDevice*>(device);
  if (semantics == HostBufferSemantics::kImmutableZeroCopy) {
    // Device memory is never the caller's memory.
    metrics::ZeroCopyFallbacks()->Add();
    semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  }
  const int64_t num_elements = src.num_elements();
  FERRY_ASSIGN_OR_RETURN(
      const int64_t device_bytes,
      DeviceBytesFor(src, device_dtype, *device, tensor_name, "CL_DEVICE_MAX_MEM_ALLOC_SIZE"));
  FERRY_ASSIGN_OR_RETURN(ClientLifetime::Token token,
                         ClientLifetime::Begin(lifetime_, fmt::format("tensor '{}'", tensor_name)));
  const std::shared_ptr<DeviceQueue>& queue = opencl_device->queue();
  FERRY_ASSIGN_OR_RETURN(
      std::shared_ptr<DeviceMemory> memory,
      DeviceMemory::Create(queue, opencl_device->memory(), device_bytes, tensor_name));
  const std::string what = fmt::format("tensor '{}' on {}", tensor_name, device->name());
  StagingRing& ring = opencl_device->ring();
  Promise<> ready;
  auto make_buffer = [&](Future<> enqueued) {
    return std::unique_ptr<Buffer>(new OpenClBuffer(opencl_device, device_dtype, src.dims, memory,
                                                    ready.future(), std::move(enqueued), lifetime_,
                                                    &ring, std::string(tensor_name)));
  };
  const Future<> enqueued_now = Future<>::Ready(OkStatus());

  if (num_elements == 0) {
    // Nothing to copy, and still the semantics' thread: the caller's for kImmutableOnlyDuringCall,
    // else a runtime thread, never inside this call (the caller may hold what on_done takes).
    auto finish = [on_done = std::move(on_done), ready, token = std::move(token)]() mutable {
      if (on_done) {  // the callback object (and what it keeps alive) goes before Ready()
        OnDoneWithHostBuffer release = std::move(on_done);
        std::move(release)();
      }
      ready.Set(OkStatus());
    };
    if (semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
      std::move(finish)();
    } else {
      BackgroundExecutor().Execute(std::move(finish));
    }
    return make_buffer(enqueued_now);
  }
  (src.dtype == device_dtype ? metrics::DirectTransfers() : metrics::ConvertedTransfers())->Add();

  const Write write{*queue, *memory, src, device_dtype, what};
  const TransferPath path = ChooseTransferPath(src, device_dtype);
  const bool only_during_call = semantics == HostBufferSemantics::kImmutableOnlyDuringCall;
  const int64_t source_bytes = num_elements * src.element_size();
  const bool small = std::max(source_bytes, device_bytes) <= kInlineCopyBytes;

  if (small && (only_during_call || path.kind == PathKind::kStaged)) {
    FERRY_RETURN_IF_ERROR(
        WriteFromOwnBlock(write, only_during_call, std::move(on_done), ready, std::move(token)));
    return make_buffer(enqueued_now);
  }
  if (path.kind != PathKind::kStaged && only_during_call) {
    FERRY_RETURN_IF_ERROR(WriteDirectAndWait(write, path, std::move(on_done), ready));
    return make_buffer(enqueued_now);
  }
  if (path.kind != PathKind::kStaged) {
    FERRY_RETURN_IF_ERROR(
        WriteDirectBehindGate(write, path, std::move(on_done), ready, std::move(token)));
    return make_buffer(enqueued_now);
  }
  if (only_during_call) {
    FERRY_RETURN_IF_ERROR(
        StageOnCallingThread(ring, write, std::move(on_done), ready, std::move(token)));
    return make_buffer(enqueued_now);
  }
  FERRY_ASSIGN_OR_RETURN(Future<> enqueued,
                         StageOnRingWorker(ring, memory, src, device_dtype, what,
                                           std::move(on_done), ready, std::move(token)));
  return make_buffer(std::move(enqueued));
}

namespace {

class OpenClBufferWriter final : public BufferWriter {
 public:
  OpenClBufferWriter(OpenClDevice* device, DType device_dtype, const Dims& dims,
                     const WriterPlacement& placement, std::string_view tensor_name,
                     std::shared_ptr<DeviceMemory> memory, std::shared_ptr<ClientLifetime> lifetime)
      : BufferWriter(device_dtype, dims, placement.size_bytes, placement.memory.kind,
                     std::string(tensor_name)),
        device_(device),
        memory_(std::move(memory)),
        lifetime_(std::move(lifetime)) {}
  ~OpenClBufferWriter() override { AbortIfUnfinished(); }

  void Start() { CompleteIfEmpty(); }

 protected:
  StatusOr<Future<>> WriteBytes(int64_t offset_bytes, const void* data, int64_t size_bytes,
                                bool last) override {
    if (size_bytes > 0) {
      FERRY_ASSIGN_OR_RETURN(ClientLifetime::Token token,
                             ClientLifetime::Begin(lifetime_, fmt::format("tensor '{}'", name())));
      const OpenClLibrary& cl = memory_->queue().cl();
      const cl_int error = cl.clEnqueueWriteBuffer(
          memory_->queue().queue(), memory_->mem(), CL_TRUE, static_cast<size_t>(offset_bytes),
          static_cast<size_t>(size_bytes), data, 0, nullptr, nullptr);
      FERRY_OPENCL_RETURN_IF_ERROR(error, "clEnqueueWriteBuffer",
                                   fmt::format("tensor '{}' on {}", name(), device_->name()));
    }
    if (last) ready_.Set(OkStatus());
    return Future<>::Ready(OkStatus());
  }
  void FailBuffer(Status status) override { ready_.Set(std::move(status)); }
  std::unique_ptr<Buffer> MakeBuffer() override {
    // Every write is blocking, so the writes are all enqueued once the buffer is ready.
    return std::unique_ptr<Buffer>(new OpenClBuffer(device_, device_dtype(), dims(), memory_,
                                                    ready_.future(), ready_.future(), lifetime_,
                                                    &device_->ring(), name()));
  }

 private:
  OpenClDevice* const device_;
  const std::shared_ptr<DeviceMemory> memory_;
  const std::shared_ptr<ClientLifetime> lifetime_;
  Promise<> ready_;
};

}  // namespace

StatusOr<std::unique_ptr<BufferWriter>> OpenClClient::CreateBufferWriter(
    DType device_dtype, const Dims& dims, Device* device, std::string_view memory_kind,
    std::string_view tensor_name) {
  FERRY_ASSIGN_OR_RETURN(
      const WriterPlacement placement,
      CheckCreateBufferWriterArgs(*this, device_dtype, dims, device, memory_kind, tensor_name));
  auto* opencl_device = static_cast<OpenClDevice*>(device);
  FERRY_ASSIGN_OR_RETURN(ClientLifetime::Token token,
                         ClientLifetime::Begin(lifetime_, fmt::format("tensor '{}'", tensor_name)));
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> memory,
                         DeviceMemory::Create(opencl_device->queue(), opencl_device->memory(),
                                              placement.size_bytes, tensor_name));
  auto writer = std::make_unique<OpenClBufferWriter>(opencl_device, device_dtype, dims, placement,
                                                     tensor_name, std::move(memory), lifetime_);
  writer->Start();
  return std::unique_ptr<BufferWriter>(std::move(writer));
}

}  // namespace ferry::opencl
