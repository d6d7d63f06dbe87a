#include "ferry/runtime/transfer.h"

#include "ferry/core/convert.h"
#include "ferry/core/metrics.h"
#include "ferry/device/client.h"
#include "ferry/runtime/dtype_policy.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {

Data::Data(std::unique_ptr<Buffer> buffer, DType logical_dtype, std::string name)
    : buffer_(std::move(buffer)), logical_dtype_(logical_dtype), name_(std::move(name)) {
  metrics::CreateDataHandles()->Add();
}

Data::~Data() { metrics::DestroyDataHandles()->Add(); }

StatusOr<std::vector<DataPtr>> TransferToDevice(
    absl::Span<const std::shared_ptr<const TensorSource>> sources, Device* device,
    const TransferToDeviceOptions& options) {
  ScopedTimer timer(metrics::TransferToDeviceTime());
  if (device == nullptr) return InvalidArgumentError("TransferToDevice: no device given");
  if (!options.device_dtypes.empty() && options.device_dtypes.size() != sources.size()) {
    return InvalidArgumentError(fmt::format(
        "TransferToDevice: {} device dtypes for {} sources (give none, or one per source)",
        options.device_dtypes.size(), sources.size()));
  }
  Client* client = device->client();
  std::vector<DataPtr> handles;
  handles.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::shared_ptr<const TensorSource>& source = sources[i];
    if (source == nullptr) {
      return InvalidArgumentError(fmt::format("TransferToDevice: source {} is null", i));
    }
    const HostView& view = source->view();
    bool downcast = false;
    FERRY_ASSIGN_OR_RETURN(
        DType device_dtype,
        ChooseDeviceDType(view.dtype,
                          options.device_dtypes.empty() ? std::nullopt : options.device_dtypes[i],
                          device->capabilities(), source->name(), &downcast));
    if (Status convertible = CheckConvertible(view.dtype, device_dtype); !convertible.ok()) {
      return Status(convertible.code(), fmt::format("tensor '{}': {}", source->name(),
                                                    std::string(convertible.message())));
    }
    if (Status readable = CheckConvertible(device_dtype, view.dtype); !readable.ok()) {
      return InvalidArgumentError(
          fmt::format("tensor '{}': storing {} as {} would make it unreadable in its own dtype: {}",
                      source->name(), DTypeName(view.dtype), DTypeName(device_dtype),
                      std::string(readable.message())));
    }
    if (downcast) metrics::SourceDowncasts()->Add();
    // The transfer owns a reference to its source until it has read the last byte; the
    // completion callback drops it (on a runtime thread for asynchronous semantics).
    OnDoneWithHostBuffer release_source = [keep_alive = source]() mutable { keep_alive.reset(); };
    // On error `handles` goes out of scope: everything this call started is released.
    FERRY_ASSIGN_OR_RETURN(
        std::unique_ptr<Buffer> buffer,
        client->BufferFromHostBuffer(view, device_dtype, device, options.semantics,
                                     std::move(release_source), source->name()));
    metrics::OutboundData()->AddSample(static_cast<double>(view.dense_size_bytes()));
    handles.push_back(std::make_shared<Data>(std::move(buffer), view.dtype, source->name()));
  }
  return handles;
}

StatusOr<std::vector<HostTensor>> TransferFromDevice(absl::Span<const DataPtr> data,
                                                     const TransferFromDeviceOptions& options) {
  ScopedTimer timer(metrics::TransferFromDeviceTime());
  std::vector<HostTensor> tensors;
  std::vector<Future<>> reads;
  tensors.reserve(data.size());
  reads.reserve(data.size());
  // Start every read before waiting on any.
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == nullptr) {
      return InvalidArgumentError(fmt::format("TransferFromDevice: data handle {} is null", i));
    }
    const Data& handle = *data[i];
    const DType host_dtype =
        options.in_device_dtype ? handle.device_dtype() : handle.logical_dtype();
    FERRY_ASSIGN_OR_RETURN(HostTensor tensor, HostTensor::Allocate(host_dtype, handle.dims()));
    if (host_dtype != handle.device_dtype()) metrics::ConvertedTransfers()->Add();
    reads.push_back(handle.buffer().ToHost(tensor.mutable_view()));
    tensors.push_back(std::move(tensor));
  }
  Status first_error;
  for (size_t i = 0; i < reads.size(); ++i) {
    const Status& status = reads[i].Await();
    if (!status.ok() && first_error.ok()) {
      first_error = Status(status.code(),
                           fmt::format("reading tensor '{}' from {}: {}", data[i]->name(),
                                       data[i]->device()->name(), std::string(status.message())));
    }
    if (status.ok())
      metrics::InboundData()->AddSample(static_cast<double>(tensors[i].size_bytes()));
  }
  if (!first_error.ok()) return first_error;
  return tensors;
}

Status AwaitReady(absl::Span<const DataPtr> data) {
  Status first_error;
  for (const DataPtr& handle : data) {
    const Status& status = handle->Ready().Await();
    if (!status.ok() && first_error.ok()) {
      first_error = Status(status.code(), fmt::format("tensor '{}': {}", handle->name(),
                                                      std::string(status.message())));
    }
  }
  return first_error;
}

}  // namespace ferry
