#include "pjrt_paths.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "ferry/core/host_tensor.h"
#include "fmt/format.h"
#include "old_copy.h"

#if FERRY_HAVE_PJRT
#include "pjrt_c_api.h"
#endif

namespace ferry::bench {

#if FERRY_HAVE_PJRT
namespace {

// Argument structs as the C API wants them: zeroed, with struct_size set.
template <typename Args>
Args ZeroedArgs(size_t struct_size) {
  Args args{};
  args.struct_size = struct_size;
  return args;
}
#define PLUGIN_ARGS(type) ZeroedArgs<type>(type##_STRUCT_SIZE)

// The plugin as a program that calls its C API itself sees it: the function table, client, device
// and memory a pjrt device hands out (Device::NativeHandles). Borrowed from ferry's client, which
// lives for the whole bench; every plugin buffer made here is destroyed before.
class Plugin {
 public:
  static StatusOr<Plugin> Of(const Device* device) {
    StatusOr<NativeDeviceHandles> handles =
        device == nullptr ? StatusOr<NativeDeviceHandles>(InvalidArgumentError("no device"))
                          : device->NativeHandles();
    if (!handles.ok() || handles->backend != "pjrt") {
      return FailedPreconditionError(
          fmt::format("the plugin's own paths need a pjrt device, not {}",
                      device == nullptr ? std::string("none") : device->name()));
    }
    return Plugin(*std::move(handles));
  }

  const NativeDeviceHandles& handles() const { return handles_; }

  // The plugin's error as a Status (the error is destroyed).
  Status Check(PJRT_Error* error, std::string_view what) const {
    if (error == nullptr) return OkStatus();
    auto message = PLUGIN_ARGS(PJRT_Error_Message_Args);
    message.error = error;
    api_.PJRT_Error_Message(&message);
    Status status = InternalError(
        fmt::format("{}: {}", what, std::string_view(message.message, message.message_size)));
    auto destroy = PLUGIN_ARGS(PJRT_Error_Destroy_Args);
    destroy.error = error;
    api_.PJRT_Error_Destroy(&destroy);
    return status;
  }

  // Waits for `event`, then destroys it.
  Status Await(PJRT_Event* event, std::string_view what) const {
    if (event == nullptr) return OkStatus();
    auto await = PLUGIN_ARGS(PJRT_Event_Await_Args);
    await.event = event;
    Status status = Check(api_.PJRT_Event_Await(&await), what);
    auto destroy = PLUGIN_ARGS(PJRT_Event_Destroy_Args);
    destroy.event = event;
    Check(api_.PJRT_Event_Destroy(&destroy), "PJRT_Event_Destroy").IgnoreError();
    return status;
  }

  void Destroy(PJRT_Buffer* buffer) const {
    auto args = PLUGIN_ARGS(PJRT_Buffer_Destroy_Args);
    args.buffer = buffer;
    Check(api_.PJRT_Buffer_Destroy(&args), "PJRT_Buffer_Destroy").IgnoreError();
  }

  // PJRT_Client_BufferFromHostBuffer of `view` (kImmutableOnlyDuringCall) onto the device's
  // default memory, waited on until the plugin has read the source and the buffer is ready.
  StatusOr<PJRT_Buffer*> Put(const HostView& view) const {
    FERRY_ASSIGN_OR_RETURN(const PJRT_Buffer_Type type, TypeOf(view.dtype));
    auto args = PLUGIN_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
    args.client = static_cast<PJRT_Client*>(handles_.client);
    args.data = view.data;
    args.type = type;
    args.dims = view.dims.data();
    args.num_dims = view.dims.size();
    if (!view.IsRowMajorDense()) {
      args.byte_strides = view.byte_strides.data();
      args.num_byte_strides = view.byte_strides.size();
    }
    args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
    args.device = static_cast<PJRT_Device*>(handles_.device);
    args.memory = static_cast<PJRT_Memory*>(handles_.memory);
    FERRY_RETURN_IF_ERROR(
        Check(api_.PJRT_Client_BufferFromHostBuffer(&args), "BufferFromHostBuffer"));
    Status waited = Await(args.done_with_host_buffer, "BufferFromHostBuffer's source read");
    auto ready = PLUGIN_ARGS(PJRT_Buffer_ReadyEvent_Args);
    ready.buffer = args.buffer;
    if (waited.ok()) waited = Check(api_.PJRT_Buffer_ReadyEvent(&ready), "Buffer_ReadyEvent");
    if (waited.ok()) waited = Await(ready.event, "the plugin buffer's readiness");
    if (!waited.ok()) {
      Destroy(args.buffer);
      return waited;
    }
    return args.buffer;
  }

  // PJRT_Buffer_ToHostBuffer of the whole buffer into the dense `destination`, waited on.
  Status Read(PJRT_Buffer* buffer, void* destination, int64_t size_bytes) const {
    auto args = PLUGIN_ARGS(PJRT_Buffer_ToHostBuffer_Args);
    args.src = buffer;
    args.dst = destination;
    args.dst_size = static_cast<size_t>(size_bytes);
    FERRY_RETURN_IF_ERROR(Check(api_.PJRT_Buffer_ToHostBuffer(&args), "ToHostBuffer"));
    return Await(args.event, "ToHostBuffer");
  }

 private:
  explicit Plugin(NativeDeviceHandles handles)
      : handles_(std::move(handles)), api_(*static_cast<const PJRT_Api*>(handles_.api)) {}

  // The dtypes the bench's cases move.
  static StatusOr<PJRT_Buffer_Type> TypeOf(DType dtype) {
    switch (dtype) {
      case DType::kF16:
        return PJRT_Buffer_Type_F16;
      case DType::kBF16:
        return PJRT_Buffer_Type_BF16;
      case DType::kF32:
        return PJRT_Buffer_Type_F32;
      case DType::kF64:
        return PJRT_Buffer_Type_F64;
      default:
        return UnimplementedError(
            fmt::format("the plugin yardstick moves no {}", DTypeName(dtype)));
    }
  }

  NativeDeviceHandles handles_;
  const PJRT_Api& api_;
};

// A plugin buffer, destroyed with its owner.
struct BufferDeleter {
  Plugin plugin;
  void operator()(PJRT_Buffer* buffer) const { plugin.Destroy(buffer); }
};
using PluginBuffer = std::unique_ptr<PJRT_Buffer, BufferDeleter>;

StatusOr<PluginBuffer> PluginPut(const Plugin& plugin, const HostView& view) {
  FERRY_ASSIGN_OR_RETURN(PJRT_Buffer * buffer, plugin.Put(view));
  return PluginBuffer(buffer, BufferDeleter{plugin});
}

class PluginPutPath : public Path {
 public:
  struct Target {
    std::shared_ptr<const TensorSource> source;
    Plugin plugin;
    DType device_dtype;
  };

  explicit PluginPutPath(std::vector<Target> targets) : targets_(std::move(targets)) {}

  Status Run() override {
    buffers_.clear();
    buffers_.reserve(targets_.size());
    for (const Target& target : targets_) {
      HostView view = target.source->view();
      std::optional<OldTemporary> converted;  // numpy's astype
      if (target.device_dtype != view.dtype) {
        FERRY_ASSIGN_OR_RETURN(converted, OldTemporary::Allocate(target.device_dtype, view.dims));
        FERRY_RETURN_IF_ERROR(OldCopyConvert(view, converted->view()));
        view = converted->view();
      }
      FERRY_ASSIGN_OR_RETURN(PluginBuffer buffer, PluginPut(target.plugin, view));
      buffers_.push_back(std::move(buffer));
    }  // each temporary is freed once its put has returned
    return OkStatus();
  }

  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    std::vector<HostTensor> results;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      FERRY_ASSIGN_OR_RETURN(
          HostTensor back,
          HostTensor::Allocate(targets_[i].device_dtype, targets_[i].source->view().dims));
      FERRY_RETURN_IF_ERROR(
          targets_[i].plugin.Read(buffers_[i].get(), back.data(), back.size_bytes()));
      results.push_back(std::move(back));
    }
    return results;
  }

  int64_t ResultUncountedDeviceBytes() const override {
    int64_t bytes = 0;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      // The plugin's buffers are host memory (counted by heap accounting).
      if (!targets_[i].plugin.handles().memory_on_host) continue;
      const HostView& view = targets_[i].source->view();
      bytes += view.num_elements() * DTypeSize(targets_[i].device_dtype);
    }
    return bytes;
  }

  void Release() override { buffers_.clear(); }

 private:
  const std::vector<Target> targets_;
  std::vector<PluginBuffer> buffers_;
};

class PluginReadPath : public Path {
 public:
  struct Tensor {
    PluginBuffer buffer;
    HostTensor destination;  // the device dtype; reused by every run
    DType logical_dtype;
  };

  explicit PluginReadPath(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {}

  Status Run() override {
    converted_.clear();
    for (Tensor& tensor : tensors_) {
      FERRY_RETURN_IF_ERROR(tensor.buffer.get_deleter().plugin.Read(
          tensor.buffer.get(), tensor.destination.data(), tensor.destination.size_bytes()));
      std::optional<OldTemporary> converted;  // numpy's astype
      if (tensor.logical_dtype != tensor.destination.dtype()) {
        FERRY_ASSIGN_OR_RETURN(
            converted, OldTemporary::Allocate(tensor.logical_dtype, tensor.destination.dims()));
        FERRY_RETURN_IF_ERROR(OldCopyConvert(tensor.destination.view(), converted->view()));
      }
      converted_.push_back(std::move(converted));
    }
    return OkStatus();
  }

  int64_t ResultHostBytes() const override {
    int64_t bytes = 0;
    for (const std::optional<OldTemporary>& converted : converted_) {
      if (converted.has_value()) bytes += converted->view().dense_size_bytes();
    }
    return bytes;
  }

  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    std::vector<HostTensor> results;
    for (size_t i = 0; i < converted_.size(); ++i) {
      const HostView view = converted_[i].has_value() ? HostView(converted_[i]->view())
                                                      : tensors_[i].destination.view();
      FERRY_ASSIGN_OR_RETURN(HostTensor copy, HostTensor::Allocate(view.dtype, view.dims));
      std::memcpy(copy.data(), view.data, static_cast<size_t>(copy.size_bytes()));
      results.push_back(std::move(copy));
    }
    converted_.clear();
    return results;
  }

  void Release() override { converted_.clear(); }

 private:
  std::vector<Tensor> tensors_;
  std::vector<std::optional<OldTemporary>> converted_;
};

}  // namespace

bool IsPjrtDevice(const Device* device) { return Plugin::Of(device).ok(); }

std::string PjrtPluginPathOf(const Device* device) {
  StatusOr<Plugin> plugin = Plugin::Of(device);
  return plugin.ok() ? plugin->handles().library : std::string();
}

StatusOr<std::unique_ptr<Path>> MakePjrtPutPath(
    std::vector<std::shared_ptr<const TensorSource>> sources, std::vector<Device*> devices,
    std::vector<DType> device_dtypes) {
  if (devices.size() != sources.size() || device_dtypes.size() != sources.size()) {
    return InvalidArgumentError("MakePjrtPutPath needs one device and one dtype per source");
  }
  std::vector<PluginPutPath::Target> targets;
  for (size_t i = 0; i < sources.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(Plugin plugin, Plugin::Of(devices[i]));
    targets.push_back({std::move(sources[i]), std::move(plugin), device_dtypes[i]});
  }
  return std::unique_ptr<Path>(std::make_unique<PluginPutPath>(std::move(targets)));
}

StatusOr<std::unique_ptr<Path>> MakePjrtReadPath(const std::vector<DataPtr>& data) {
  std::vector<PluginReadPath::Tensor> tensors;
  for (const DataPtr& tensor : data) {
    FERRY_ASSIGN_OR_RETURN(Plugin plugin, Plugin::Of(tensor->device()));
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> in_device_dtype,
                           TransferFromDevice({tensor}, {.in_device_dtype = true}));
    FERRY_ASSIGN_OR_RETURN(PluginBuffer buffer, PluginPut(plugin, in_device_dtype[0].view()));
    FERRY_ASSIGN_OR_RETURN(HostTensor destination,
                           HostTensor::Allocate(tensor->device_dtype(), tensor->dims()));
    std::memset(destination.data(), 0xa5, static_cast<size_t>(destination.size_bytes()));
    tensors.push_back({std::move(buffer), std::move(destination), tensor->logical_dtype()});
  }
  return std::unique_ptr<Path>(std::make_unique<PluginReadPath>(std::move(tensors)));
}

#else  // !FERRY_HAVE_PJRT

bool IsPjrtDevice(const Device*) { return false; }

std::string PjrtPluginPathOf(const Device*) { return std::string(); }

StatusOr<std::unique_ptr<Path>> MakePjrtPutPath(std::vector<std::shared_ptr<const TensorSource>>,
                                                std::vector<Device*>, std::vector<DType>) {
  return FailedPreconditionError("ferry-bench was built without the pjrt backend");
}

StatusOr<std::unique_ptr<Path>> MakePjrtReadPath(const std::vector<DataPtr>&) {
  return FailedPreconditionError("ferry-bench was built without the pjrt backend");
}

#endif  // FERRY_HAVE_PJRT

}  // namespace ferry::bench
