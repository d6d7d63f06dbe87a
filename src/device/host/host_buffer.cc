#include "src/device/host/host_buffer.h"

#include <cstdlib>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/device/host/host_client.h"

namespace ferry::host {

HostBuffer::HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
                       std::shared_ptr<DeviceAllocation> allocation, Future<> ready,
                       std::weak_ptr<TransferEngine> engine)
    : device_(device),
      device_dtype_(device_dtype),
      dims_(std::move(dims)),
      allocation_(std::move(allocation)),
      ready_(std::move(ready)),
      engine_(std::move(engine)) {}

HostBuffer::HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
                       std::shared_ptr<DeviceAllocation> allocation,
                       std::weak_ptr<TransferEngine> engine)
    : HostBuffer(device, device_dtype, std::move(dims), std::move(allocation),
                 Future<>::Ready(OkStatus()), std::move(engine)) {}

Device* HostBuffer::device() const { return device_; }

int64_t HostBuffer::size_bytes() const {
  return SaturatedProduct(SaturatedNumElements(dims_), DTypeSize(device_dtype_));
}

StatusOr<HostView> HostBuffer::HostAccessibleView() const {
  if (engine_.expired()) {
    return FailedPreconditionError(
        "HostAccessibleView: the buffer's host client has been destroyed");
  }
  return HostView::Dense(allocation_->data(), device_dtype_, dims_);
}

Future<> HostBuffer::ToHost(const MutableHostView& dst) {
  if (Status valid = CheckToHostArgs(dims_, device_dtype_, dst); !valid.ok()) {
    return Future<>::Ready(valid);
  }
  auto plan =
      CopyConvertPlan::Create(HostView::Dense(allocation_->data(), device_dtype_, dims_), dst);
  if (!plan.ok()) return Future<>::Ready(plan.status());

  const int64_t bytes = SaturatedProduct(plan->num_elements(), DTypeSize(device_dtype_));
  return CopyOutOnceReady(*std::move(plan), bytes, "ToHost");
}

Future<> HostBuffer::CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) {
  if (Status valid = CheckRawRange(this->size_bytes(), offset_bytes, size_bytes, dst);
      !valid.ok()) {
    return Future<>::Ready(valid);
  }
  if (size_bytes == 0) {
    Promise<> done;
    ready_.OnReady([done](const Status& ready) { done.Set(ready); });
    return done.future();
  }
  // The bytes, as bytes: the plan of a dense byte range is one memcpy (split over the engine's
  // workers when large).
  auto plan = CopyConvertPlan::Create(
      HostView::Dense(allocation_->data() + offset_bytes, DType::kU8, {size_bytes}),
      MutableHostView::Dense(dst, DType::kU8, {size_bytes}));
  if (!plan.ok()) return Future<>::Ready(plan.status());
  return CopyOutOnceReady(*std::move(plan), size_bytes, "CopyRawToHost");
}

Future<> HostBuffer::CopyOutOnceReady(CopyConvertPlan plan, int64_t bytes, std::string_view what) {
  Promise<> promise;
  const bool small = bytes <= HostClient::kInlineCopyBytes;
  // The read holds the memory (an allocation, or an alias and so its on_done) until it is over.
  ready_.OnReady([promise, plan = std::move(plan), engine = engine_, allocation = allocation_,
                  small, what = std::string(what)](const Status& ready) mutable {
    // Every way out lets go of the memory before the read's future completes (device.h).
    if (!ready.ok()) {
      allocation.reset();
      promise.Set(ready);
      return;
    }
    std::shared_ptr<TransferEngine> running = engine.lock();
    if (!running) {
      allocation.reset();
      promise.Set(FailedPreconditionError(
          fmt::format("{}: the buffer's host client has been destroyed", what)));
      return;
    }
    if (small) {
      plan.CopyAll();
      allocation.reset();
      promise.Set(OkStatus());
      return;
    }
    Status submitted = running->Submit(
        std::move(plan), [promise, allocation = std::move(allocation)](Status status) mutable {
          // The memory may be freed now (if the buffer is gone), and an alias's on_done run.
          allocation.reset();
          promise.Set(std::move(status));
        });
    if (!submitted.ok()) promise.Set(std::move(submitted));
  });
  return promise.future();
}

}  // namespace ferry::host
