#include "pjrt_paths.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "ferry/core/host_tensor.h"
#include "fmt/format.h"
#include "old_copy.h"

#if FERRY_HAVE_PJRT
#include "src/device/pjrt/pjrt_client.h"
#include "src/device/pjrt/pjrt_runtime.h"
#endif

namespace ferry::bench {

#if FERRY_HAVE_PJRT
namespace {

using pjrt::PjrtDevice;
using pjrt::PjrtRuntime;

// A plugin buffer, destroyed with its owner. The deleter holds the runtime, so the PJRT client
// outlives every buffer made here.
struct BufferDeleter {
  std::shared_ptr<PjrtRuntime> runtime;
  void operator()(PJRT_Buffer* buffer) const {
    auto args = FERRY_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
    args.buffer = buffer;
    runtime->Check(runtime->api().PJRT_Buffer_Destroy(&args), "Buffer_Destroy").IgnoreError();
  }
};
using PluginBuffer = std::unique_ptr<PJRT_Buffer, BufferDeleter>;

const PjrtDevice* AsPjrtDevice(const Device* device) {
  return dynamic_cast<const PjrtDevice*>(device);
}

StatusOr<const pjrt::PjrtClient*> ClientOf(const Device* device) {
  const PjrtDevice* pjrt_device = AsPjrtDevice(device);
  const auto* client =
      pjrt_device == nullptr ? nullptr : dynamic_cast<pjrt::PjrtClient*>(pjrt_device->client());
  if (client == nullptr) {
    return FailedPreconditionError(
        fmt::format("the plugin's own paths need a pjrt device, not {}",
                    device == nullptr ? std::string("none") : device->name()));
  }
  return client;
}

// PJRT_Client_BufferFromHostBuffer of `view` (kImmutableOnlyDuringCall), waited on until the
// plugin has read the source and the buffer is ready.
StatusOr<PluginBuffer> PluginPut(const std::shared_ptr<PjrtRuntime>& runtime,
                                 const PjrtDevice& device, const HostView& view) {
  const PJRT_Api& api = runtime->api();
  auto args = FERRY_PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args);
  args.client = runtime->client();
  args.data = view.data;
  args.type = pjrt::ToPjrtType(view.dtype);
  args.dims = view.dims.data();
  args.num_dims = view.dims.size();
  if (!view.IsRowMajorDense()) {
    args.byte_strides = view.byte_strides.data();
    args.num_byte_strides = view.byte_strides.size();
  }
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = device.pjrt_device();
  args.memory = device.default_memory();
  FERRY_RETURN_IF_ERROR(
      runtime->Check(api.PJRT_Client_BufferFromHostBuffer(&args), "BufferFromHostBuffer"));
  PluginBuffer buffer(args.buffer, BufferDeleter{runtime});
  FERRY_RETURN_IF_ERROR(
      pjrt::AwaitEvent(api, args.done_with_host_buffer, "BufferFromHostBuffer's source read"));
  auto ready = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready.buffer = buffer.get();
  FERRY_RETURN_IF_ERROR(runtime->Check(api.PJRT_Buffer_ReadyEvent(&ready), "Buffer_ReadyEvent"));
  FERRY_RETURN_IF_ERROR(pjrt::AwaitEvent(api, ready.event, "the plugin buffer's readiness"));
  return buffer;
}

// PJRT_Buffer_ToHostBuffer of the whole buffer into the dense `destination`, waited on.
Status PluginRead(const PjrtRuntime& runtime, PJRT_Buffer* buffer, void* destination,
                  int64_t size_bytes) {
  const PJRT_Api& api = runtime.api();
  auto args = FERRY_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = buffer;
  args.dst = destination;
  args.dst_size = static_cast<size_t>(size_bytes);
  FERRY_RETURN_IF_ERROR(runtime.Check(api.PJRT_Buffer_ToHostBuffer(&args), "ToHostBuffer"));
  return pjrt::AwaitEvent(api, args.event, "ToHostBuffer");
}

class PluginPutPath : public Path {
 public:
  struct Target {
    std::shared_ptr<const TensorSource> source;
    const PjrtDevice* device;
    std::shared_ptr<PjrtRuntime> runtime;
    DType device_dtype;
    bool buffers_on_cpu;  // the plugin's buffers are host memory (counted by heap accounting)
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
      FERRY_ASSIGN_OR_RETURN(PluginBuffer buffer, PluginPut(target.runtime, *target.device, view));
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
          PluginRead(*targets_[i].runtime, buffers_[i].get(), back.data(), back.size_bytes()));
      results.push_back(std::move(back));
    }
    return results;
  }

  int64_t ResultUncountedDeviceBytes() const override {
    int64_t bytes = 0;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      if (!targets_[i].buffers_on_cpu) continue;
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
    std::shared_ptr<PjrtRuntime> runtime;
    PluginBuffer buffer;
    HostTensor destination;  // the device dtype; reused by every run
    DType logical_dtype;
  };

  explicit PluginReadPath(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {}

  Status Run() override {
    converted_.clear();
    for (Tensor& tensor : tensors_) {
      FERRY_RETURN_IF_ERROR(PluginRead(*tensor.runtime, tensor.buffer.get(),
                                       tensor.destination.data(), tensor.destination.size_bytes()));
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

bool IsPjrtDevice(const Device* device) { return AsPjrtDevice(device) != nullptr; }

std::string PjrtPluginPathOf(const Device* device) {
  StatusOr<const pjrt::PjrtClient*> client = ClientOf(device);
  return client.ok() ? (*client)->platform().plugin_path : std::string();
}

StatusOr<std::unique_ptr<Path>> MakePjrtPutPath(
    std::vector<std::shared_ptr<const TensorSource>> sources, std::vector<Device*> devices,
    std::vector<DType> device_dtypes) {
  if (devices.size() != sources.size() || device_dtypes.size() != sources.size()) {
    return InvalidArgumentError("MakePjrtPutPath needs one device and one dtype per source");
  }
  std::vector<PluginPutPath::Target> targets;
  for (size_t i = 0; i < sources.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(const pjrt::PjrtClient* client, ClientOf(devices[i]));
    targets.push_back({std::move(sources[i]), AsPjrtDevice(devices[i]), client->runtime(),
                       device_dtypes[i], client->platform().buffers_on_cpu});
  }
  return std::unique_ptr<Path>(std::make_unique<PluginPutPath>(std::move(targets)));
}

StatusOr<std::unique_ptr<Path>> MakePjrtReadPath(const std::vector<DataPtr>& data) {
  std::vector<PluginReadPath::Tensor> tensors;
  for (const DataPtr& tensor : data) {
    FERRY_ASSIGN_OR_RETURN(const pjrt::PjrtClient* client, ClientOf(tensor->device()));
    const std::shared_ptr<PjrtRuntime>& runtime = client->runtime();
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> in_device_dtype,
                           TransferFromDevice({tensor}, {.in_device_dtype = true}));
    FERRY_ASSIGN_OR_RETURN(PluginBuffer buffer, PluginPut(runtime, *AsPjrtDevice(tensor->device()),
                                                          in_device_dtype[0].view()));
    FERRY_ASSIGN_OR_RETURN(HostTensor destination,
                           HostTensor::Allocate(tensor->device_dtype(), tensor->dims()));
    std::memset(destination.data(), 0xa5, static_cast<size_t>(destination.size_bytes()));
    tensors.push_back(
        {runtime, std::move(buffer), std::move(destination), tensor->logical_dtype()});
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
