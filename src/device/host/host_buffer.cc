#include "src/device/host/host_buffer.h"

#include <cstdlib>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/device/host/host_client.h"

namespace ferry::host {

StatusOr<std::shared_ptr<DeviceAllocation>> DeviceAllocation::Create(
    std::shared_ptr<MemoryAccount> account, int64_t size_bytes, std::string_view tensor_name,
    std::string_view device_name) {
  FERRY_RETURN_IF_ERROR(account->Reserve(size_bytes, tensor_name, device_name));
  std::byte* data = AllocateHostMemory(size_bytes);
  if (data == nullptr) {
    account->Release(size_bytes);
    return ResourceExhaustedError(fmt::format("tensor '{}': device {} could not allocate {} bytes",
                                              tensor_name, device_name, size_bytes));
  }
  return std::make_shared<DeviceAllocation>(CreateKey(), std::move(account), data, size_bytes);
}

DeviceAllocation::~DeviceAllocation() {
  FreeHostMemory(data_, size_bytes_);
  account_->Release(size_bytes_);
}

HostBuffer::HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
                       std::shared_ptr<DeviceAllocation> allocation, Future<> ready,
                       std::weak_ptr<TransferEngine> engine)
    : device_(device),
      device_dtype_(device_dtype),
      dims_(std::move(dims)),
      allocation_(std::move(allocation)),
      ready_(std::move(ready)),
      engine_(std::move(engine)) {}

HostBuffer::HostBuffer(HostDevice* device, DType device_dtype, Dims dims, const void* aliased,
                       OnDoneWithHostBuffer on_done, std::weak_ptr<TransferEngine> engine)
    : device_(device),
      device_dtype_(device_dtype),
      dims_(std::move(dims)),
      aliased_(aliased),
      on_alias_done_(std::move(on_done)),
      ready_(Future<>::Ready(OkStatus())),
      engine_(std::move(engine)) {}

HostBuffer::~HostBuffer() {
  // An alias read the caller's memory until now: this is when ferry is done with it.
  if (on_alias_done_) std::move(on_alias_done_)();
}

Device* HostBuffer::device() const { return device_; }

int64_t HostBuffer::size_bytes() const {
  int64_t count = 1;
  for (int64_t dim : dims_) count *= dim;
  return count * DTypeSize(device_dtype_);
}

const std::byte* HostBuffer::data() const {
  return aliased_ != nullptr ? static_cast<const std::byte*>(aliased_) : allocation_->data();
}

StatusOr<HostView> HostBuffer::HostAccessibleView() const {
  if (engine_.expired()) {
    return FailedPreconditionError(
        "HostAccessibleView: the buffer's host client has been destroyed");
  }
  return HostView::Dense(data(), device_dtype_, dims_);
}

Future<> HostBuffer::ToHost(const MutableHostView& dst) {
  if (Status valid = CheckToHostArgs(dims_, device_dtype_, dst); !valid.ok()) {
    return Future<>::Ready(valid);
  }
  auto plan = CopyConvertPlan::Create(HostView::Dense(data(), device_dtype_, dims_), dst);
  if (!plan.ok()) return Future<>::Ready(plan.status());

  Promise<> promise;
  const bool small =
      plan->num_elements() * DTypeSize(device_dtype_) <= HostClient::kInlineCopyBytes;
  ready_.OnReady([promise, plan = *std::move(plan), engine = engine_, allocation = allocation_,
                  small](const Status& ready) mutable {
    if (!ready.ok()) {
      promise.Set(ready);
      return;
    }
    std::shared_ptr<TransferEngine> running = engine.lock();
    if (!running) {
      promise.Set(FailedPreconditionError("ToHost: the buffer's host client has been destroyed"));
      return;
    }
    if (small) {
      plan.CopyAll();
      promise.Set(OkStatus());
      return;
    }
    Status submitted = running->Submit(
        std::move(plan), [promise, allocation = std::move(allocation)](Status status) mutable {
          allocation.reset();  // the device memory may be freed now (if the buffer is gone)
          promise.Set(std::move(status));
        });
    if (!submitted.ok()) promise.Set(std::move(submitted));
  });
  return promise.future();
}

}  // namespace ferry::host
