#include "transfer_paths.h"

#include <dlfcn.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "fmt/format.h"
#include "old_copy.h"
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>

namespace ferry::bench {
namespace {

class H2DFerryPath : public DeviceHandlesPath {
 public:
  H2DFerryPath(std::vector<std::shared_ptr<const TensorSource>> sources, Device* device,
               TransferToDeviceOptions options)
      : sources_(std::move(sources)), device_(device), options_(std::move(options)) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(sources_, device_, options_));
    return AwaitReady(handles_);
  }

 private:
  const std::vector<std::shared_ptr<const TensorSource>> sources_;
  Device* const device_;
  const TransferToDeviceOptions options_;
};

class H2DStagedPath : public DeviceHandlesPath {
 public:
  H2DStagedPath(std::vector<std::shared_ptr<const TensorSource>> sources, Device* device,
                std::vector<DType> device_dtypes)
      : sources_(std::move(sources)), device_(device), device_dtypes_(std::move(device_dtypes)) {}

  Status Run() override {
    std::vector<std::shared_ptr<const TensorSource>> staged;
    staged.reserve(sources_.size());
    TransferToDeviceOptions options;
    options.semantics = kBenchSemantics;
    options.device_dtypes.assign(device_dtypes_.begin(), device_dtypes_.end());
    for (size_t i = 0; i < sources_.size(); ++i) {
      const HostView& view = sources_[i]->view();
      FERRY_ASSIGN_OR_RETURN(OldTemporary temporary,
                             OldTemporary::Allocate(device_dtypes_[i], view.dims));
      FERRY_RETURN_IF_ERROR(OldCopyConvert(view, temporary.view()));
      FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const TensorSource> source,
                             OldTemporary::ToSource(std::move(temporary), sources_[i]->name()));
      staged.push_back(std::move(source));
    }
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(staged, device_, options));
    return AwaitReady(handles_);  // `staged` frees the temporaries on the way out
  }

 private:
  const std::vector<std::shared_ptr<const TensorSource>> sources_;
  Device* const device_;
  const std::vector<DType> device_dtypes_;
};

class D2HFerryPath : public Path {
 public:
  explicit D2HFerryPath(std::vector<DataPtr> data) : data_(std::move(data)) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(results_, TransferFromDevice(data_));
    return OkStatus();
  }
  int64_t ResultHostBytes() const override {
    int64_t bytes = 0;
    for (const HostTensor& tensor : results_) bytes += tensor.size_bytes();
    return bytes;
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override { return std::move(results_); }
  void Release() override { results_.clear(); }

 private:
  const std::vector<DataPtr> data_;
  std::vector<HostTensor> results_;
};

// Copies old-path results (fresh temporaries) into host tensors for the correctness check.
StatusOr<std::vector<HostTensor>> OldResultsOnHost(std::vector<OldTemporary> results) {
  std::vector<HostTensor> tensors;
  for (const OldTemporary& result : results) {
    const MutableHostView& view = result.view();
    FERRY_ASSIGN_OR_RETURN(HostTensor tensor, HostTensor::Allocate(view.dtype, view.dims));
    std::memcpy(tensor.data(), view.data, static_cast<size_t>(tensor.size_bytes()));
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

int64_t OldResultBytes(const std::vector<OldTemporary>& results) {
  int64_t bytes = 0;
  for (const OldTemporary& result : results) bytes += result.view().dense_size_bytes();
  return bytes;
}

class D2HStagedPath : public Path {
 public:
  explicit D2HStagedPath(std::vector<DataPtr> data) : data_(std::move(data)) {}

  Status Run() override {
    results_.clear();
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> in_device_dtype,
                           TransferFromDevice(data_, {.in_device_dtype = true}));
    for (size_t i = 0; i < data_.size(); ++i) {
      FERRY_ASSIGN_OR_RETURN(OldTemporary result,
                             OldTemporary::Allocate(data_[i]->logical_dtype(), data_[i]->dims()));
      FERRY_RETURN_IF_ERROR(OldCopyConvert(in_device_dtype[i].view(), result.view()));
      results_.push_back(std::move(result));
    }
    return OkStatus();  // `in_device_dtype` is freed on the way out
  }
  int64_t ResultHostBytes() const override { return OldResultBytes(results_); }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    return OldResultsOnHost(std::move(results_));
  }
  void Release() override { results_.clear(); }

 private:
  const std::vector<DataPtr> data_;
  std::vector<OldTemporary> results_;
};

// A copy of device data onto another device (CopyToDevice), waited for: ferry's way, and the way
// Buffer::CopyToDevice went before it returned at once (read into host memory, put from there).
class D2DPath : public DeviceHandlesPath {
 public:
  D2DPath(std::vector<DataPtr> data, Device* target, bool through_host_and_wait)
      : data_(std::move(data)), target_(target), through_host_and_wait_(through_host_and_wait) {}

  Status Run() override {
    if (!through_host_and_wait_) {
      FERRY_ASSIGN_OR_RETURN(handles_, CopyToDevice(data_, target_));
      return AwaitReady(handles_);
    }
    FERRY_RETURN_IF_ERROR(AwaitReady(data_));
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> staged,
                           TransferFromDevice(data_, {.in_device_dtype = true}));
    std::vector<std::shared_ptr<const TensorSource>> sources;
    for (size_t i = 0; i < staged.size(); ++i) {
      sources.push_back(TensorSource::FromHostTensor(std::move(staged[i]), data_[i]->name()));
    }
    TransferToDeviceOptions options;
    options.semantics = HostBufferSemantics::kImmutableOnlyDuringCall;
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(sources, target_, options));
    return AwaitReady(handles_);
  }

 private:
  const std::vector<DataPtr> data_;
  Device* const target_;
  const bool through_host_and_wait_;
};

TransferToDeviceOptions BenchOptions() {
  TransferToDeviceOptions options;
  options.semantics = kBenchSemantics;
  return options;
}

class ShardedH2DFerryPath : public Path {
 public:
  ShardedH2DFerryPath(std::shared_ptr<const TensorSource> source, Sharding sharding)
      : source_(std::move(source)), sharding_(std::move(sharding)) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(sharded_, TransferShardsToDevice(source_, sharding_, BenchOptions()));
    return AwaitReady(sharded_->shards());
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    if (sharded_ == nullptr) return FailedPreconditionError("no sharded result");
    return TransferFromDevice(sharded_->shards(), {.in_device_dtype = true});
  }
  void Release() override { sharded_.reset(); }

 private:
  const std::shared_ptr<const TensorSource> source_;
  const Sharding sharding_;
  ShardedDataPtr sharded_;
};

class ShardedH2DStagedPath : public DeviceHandlesPath {
 public:
  ShardedH2DStagedPath(std::shared_ptr<const TensorSource> source, Sharding sharding)
      : source_(std::move(source)), sharding_(std::move(sharding)) {}

  Status Run() override {
    handles_.clear();
    const HostView& view = source_->view();
    FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndex> indices, sharding_.ShardIndices(view.dims));
    const TransferToDeviceOptions options = BenchOptions();
    for (size_t i = 0; i < indices.size(); ++i) {
      const HostView shard = SubView(view, indices[i]);
      FERRY_ASSIGN_OR_RETURN(OldTemporary temporary,
                             OldTemporary::Allocate(view.dtype, shard.dims));
      FERRY_RETURN_IF_ERROR(OldCopyConvert(shard, temporary.view()));
      FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const TensorSource> staged,
                             OldTemporary::ToSource(std::move(temporary), source_->name()));
      FERRY_ASSIGN_OR_RETURN(
          std::vector<DataPtr> data,
          TransferToDevice({std::move(staged)}, sharding_.mesh().devices()[i], options));
      handles_.push_back(std::move(data[0]));  // the temporary is freed here
    }
    return AwaitReady(handles_);
  }

 private:
  const std::shared_ptr<const TensorSource> source_;
  const Sharding sharding_;
};

class AssembleShardsPath : public Path {
 public:
  explicit AssembleShardsPath(ShardedDataPtr data) : data_(std::move(data)) {}

  Status Run() override {
    result_.reset();
    FERRY_ASSIGN_OR_RETURN(HostTensor whole, AssembleShards(*data_));
    result_ = std::move(whole);
    return OkStatus();
  }
  int64_t ResultHostBytes() const override { return result_ ? result_->size_bytes() : 0; }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    if (!result_) return FailedPreconditionError("no assembled result");
    std::vector<HostTensor> results;
    results.push_back(std::move(*result_));
    result_.reset();
    return results;
  }
  void Release() override { result_.reset(); }

 private:
  const ShardedDataPtr data_;
  std::optional<HostTensor> result_;
};

class LocalShardsStagedPath : public Path {
 public:
  explicit LocalShardsStagedPath(ShardedDataPtr data) : data_(std::move(data)) {}

  Status Run() override {
    results_.clear();
    FERRY_ASSIGN_OR_RETURN(std::vector<LocalShard> shards, LocalShards(*data_));
    FERRY_ASSIGN_OR_RETURN(OldTemporary whole,
                           OldTemporary::Allocate(data_->logical_dtype(), data_->global_dims()));
    for (const LocalShard& shard : shards) {
      FERRY_RETURN_IF_ERROR(OldCopyConvert(shard.data.view(), SubView(whole.view(), shard.index)));
    }
    results_.push_back(std::move(whole));
    return OkStatus();  // `shards` is freed on the way out
  }
  int64_t ResultHostBytes() const override { return OldResultBytes(results_); }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    return OldResultsOnHost(std::move(results_));
  }
  void Release() override { results_.clear(); }

 private:
  const ShardedDataPtr data_;
  std::vector<OldTemporary> results_;
};

// The four OpenCL entries the raw yardstick calls, from the library ferry's opencl device uses
// (NativeDeviceHandles::library: already loaded, so dlopen returns the same library and its
// objects are the device's own).
struct RawOpenCl {
  decltype(&::clCreateBuffer) create_buffer = nullptr;
  decltype(&::clReleaseMemObject) release = nullptr;
  decltype(&::clEnqueueWriteBuffer) write = nullptr;
  decltype(&::clEnqueueReadBuffer) read = nullptr;

  static StatusOr<RawOpenCl> Open(const std::string& library) {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed, as ferry's
    if (handle == nullptr) {
      return UnavailableError(fmt::format("raw_clwrite: dlopen({}): {}", library, dlerror()));
    }
    RawOpenCl cl;
    cl.create_buffer =
        reinterpret_cast<decltype(cl.create_buffer)>(dlsym(handle, "clCreateBuffer"));
    cl.release = reinterpret_cast<decltype(cl.release)>(dlsym(handle, "clReleaseMemObject"));
    cl.write = reinterpret_cast<decltype(cl.write)>(dlsym(handle, "clEnqueueWriteBuffer"));
    cl.read = reinterpret_cast<decltype(cl.read)>(dlsym(handle, "clEnqueueReadBuffer"));
    if (!cl.create_buffer || !cl.release || !cl.write || !cl.read) {
      return UnavailableError(fmt::format("raw_clwrite: {} lacks an OpenCL 1.0 entry", library));
    }
    return cl;
  }
};

Status ClStatus(cl_int code, std::string_view what, std::string_view tensor) {
  if (code == CL_SUCCESS) return OkStatus();
  return InternalError(
      fmt::format("{} of tensor '{}' failed: OpenCL error {}", what, tensor, code));
}

// One blocking clEnqueueWriteBuffer of the dense source into a cl_mem of its own, on the device's
// own queue (NativeDeviceHandles::queue).
class RawClWritePath : public Path {
 public:
  RawClWritePath(std::shared_ptr<const TensorSource> source, RawOpenCl cl, cl_command_queue queue,
                 cl_mem buffer)
      : source_(std::move(source)), cl_(cl), queue_(queue), buffer_(buffer) {}
  ~RawClWritePath() override { cl_.release(buffer_); }
  RawClWritePath(const RawClWritePath&) = delete;
  RawClWritePath& operator=(const RawClWritePath&) = delete;

  Status Run() override {
    const HostView& view = source_->view();
    return ClStatus(
        cl_.write(queue_, buffer_, CL_TRUE, 0, static_cast<size_t>(view.dense_size_bytes()),
                  view.data, 0, nullptr, nullptr),
        "clEnqueueWriteBuffer", source_->name());
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    const HostView& view = source_->view();
    FERRY_ASSIGN_OR_RETURN(HostTensor back, HostTensor::Allocate(view.dtype, view.dims));
    FERRY_RETURN_IF_ERROR(
        ClStatus(cl_.read(queue_, buffer_, CL_TRUE, 0, static_cast<size_t>(back.size_bytes()),
                          back.data(), 0, nullptr, nullptr),
                 "clEnqueueReadBuffer", source_->name()));
    std::vector<HostTensor> results;
    results.push_back(std::move(back));
    return results;
  }
  void Release() override {}

 private:
  const std::shared_ptr<const TensorSource> source_;
  const RawOpenCl cl_;
  const cl_command_queue queue_;
  const cl_mem buffer_;
};

}  // namespace

std::unique_ptr<Path> MakeH2DFerryPath(std::vector<std::shared_ptr<const TensorSource>> sources,
                                       Device* device, TransferToDeviceOptions options) {
  return std::make_unique<H2DFerryPath>(std::move(sources), device, std::move(options));
}

std::unique_ptr<Path> MakeH2DStagedPath(std::vector<std::shared_ptr<const TensorSource>> sources,
                                        Device* device, std::vector<DType> device_dtypes) {
  return std::make_unique<H2DStagedPath>(std::move(sources), device, std::move(device_dtypes));
}

std::unique_ptr<Path> MakeD2HFerryPath(std::vector<DataPtr> data) {
  return std::make_unique<D2HFerryPath>(std::move(data));
}

std::unique_ptr<Path> MakeD2HStagedPath(std::vector<DataPtr> data) {
  return std::make_unique<D2HStagedPath>(std::move(data));
}

std::unique_ptr<Path> MakeD2DFerryPath(std::vector<DataPtr> data, Device* target) {
  return std::make_unique<D2DPath>(std::move(data), target, false);
}

std::unique_ptr<Path> MakeD2DStagedPath(std::vector<DataPtr> data, Device* target) {
  return std::make_unique<D2DPath>(std::move(data), target, true);
}

std::unique_ptr<Path> MakeShardedH2DFerryPath(std::shared_ptr<const TensorSource> source,
                                              Sharding sharding) {
  return std::make_unique<ShardedH2DFerryPath>(std::move(source), std::move(sharding));
}

std::unique_ptr<Path> MakeShardedH2DStagedPath(std::shared_ptr<const TensorSource> source,
                                               Sharding sharding) {
  return std::make_unique<ShardedH2DStagedPath>(std::move(source), std::move(sharding));
}

std::unique_ptr<Path> MakeAssembleShardsPath(ShardedDataPtr data) {
  return std::make_unique<AssembleShardsPath>(std::move(data));
}

std::unique_ptr<Path> MakeLocalShardsStagedPath(ShardedDataPtr data) {
  return std::make_unique<LocalShardsStagedPath>(std::move(data));
}

StatusOr<std::unique_ptr<Path>> MakeRawClWritePath(std::shared_ptr<const TensorSource> source,
                                                   Device* device) {
  StatusOr<NativeDeviceHandles> handles =
      device == nullptr ? StatusOr<NativeDeviceHandles>(InvalidArgumentError("no device"))
                        : device->NativeHandles();
  if (!handles.ok() || handles->backend != "opencl") {
    return FailedPreconditionError(fmt::format("raw_clwrite needs an opencl device, not {}",
                                               device == nullptr ? "none" : device->name()));
  }
  const HostView& view = source->view();
  if (!view.IsRowMajorDense()) return FailedPreconditionError("raw_clwrite needs a dense source");
  FERRY_ASSIGN_OR_RETURN(RawOpenCl cl, RawOpenCl::Open(handles->library));
  cl_int code = CL_SUCCESS;
  cl_mem buffer = cl.create_buffer(static_cast<cl_context>(handles->client), CL_MEM_READ_WRITE,
                                   static_cast<size_t>(view.dense_size_bytes()), nullptr, &code);
  FERRY_RETURN_IF_ERROR(ClStatus(code, "clCreateBuffer", source->name()));
  auto path = std::make_unique<RawClWritePath>(
      std::move(source), cl, static_cast<cl_command_queue>(handles->queue), buffer);
  FERRY_RETURN_IF_ERROR(path->Run());  // the first write touches the buffer's pages
  return std::unique_ptr<Path>(std::move(path));
}

}  // namespace ferry::bench
