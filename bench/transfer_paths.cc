#include "transfer_paths.h"

#include <utility>

#include "ferry/core/copy_convert.h"

namespace ferry::bench {
namespace {

class H2DFerryPath : public Path {
 public:
  H2DFerryPath(std::vector<std::shared_ptr<const TensorSource>> sources, Device* device,
               TransferToDeviceOptions options)
      : sources_(std::move(sources)), device_(device), options_(std::move(options)) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(sources_, device_, options_));
    return AwaitReady(handles_);
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    return TransferFromDevice(handles_, {.in_device_dtype = true});
  }
  void Release() override { handles_.clear(); }

 private:
  const std::vector<std::shared_ptr<const TensorSource>> sources_;
  Device* const device_;
  const TransferToDeviceOptions options_;
  std::vector<DataPtr> handles_;
};

class H2DStagedPath : public Path {
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
      FERRY_ASSIGN_OR_RETURN(HostTensor temporary,
                             HostTensor::Allocate(device_dtypes_[i], view.dims));
      FERRY_RETURN_IF_ERROR(CopyConvert(view, temporary.mutable_view()));
      staged.push_back(TensorSource::FromHostTensor(std::move(temporary), sources_[i]->name()));
    }
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(staged, device_, options));
    return AwaitReady(handles_);  // `staged` frees the temporaries on the way out
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    return TransferFromDevice(handles_, {.in_device_dtype = true});
  }
  void Release() override { handles_.clear(); }

 private:
  const std::vector<std::shared_ptr<const TensorSource>> sources_;
  Device* const device_;
  const std::vector<DType> device_dtypes_;
  std::vector<DataPtr> handles_;
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

 protected:
  const std::vector<DataPtr> data_;
  std::vector<HostTensor> results_;
};

class D2HStagedPath : public D2HFerryPath {
 public:
  using D2HFerryPath::D2HFerryPath;

  Status Run() override {
    results_.clear();
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> in_device_dtype,
                           TransferFromDevice(data_, {.in_device_dtype = true}));
    for (size_t i = 0; i < data_.size(); ++i) {
      FERRY_ASSIGN_OR_RETURN(HostTensor result,
                             HostTensor::Allocate(data_[i]->logical_dtype(), data_[i]->dims()));
      FERRY_RETURN_IF_ERROR(CopyConvert(in_device_dtype[i].view(), result.mutable_view()));
      results_.push_back(std::move(result));
    }
    return OkStatus();  // `in_device_dtype` is freed on the way out
  }
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

}  // namespace ferry::bench
