// The opencl backend: one `Device` per OpenCL device of every platform ("opencl:0", ...), reached
// through the ICD loader opened at run time (opencl_library.h). On a machine without OpenCL the
// factory returns Unavailable with the reason and the rest of ferry works as before.
//
// Host -> device, per source:
// - dense in the device dtype: one non-blocking clEnqueueWriteBuffer straight from the caller's
//   memory;
// - 2-D / 3-D rectangular in the device dtype (positive strides, contiguous rows):
//   clEnqueueWriteBufferRect, also straight from the caller's memory;
// - anything else (a conversion, other strides): through the device's StagingRing, each chunk
//   filled by the fused copy-convert while the previous ones are in flight; small ones
//   (kInlineCopyBytes) through a block of their own, on the calling thread.
// `on_done` and Ready() complete from the OpenCL event callback of the last command (see
// staging_ring.h for what callbacks may do). kImmutableOnlyDuringCall waits for the source to be
// read (clWaitForEvents, or the end of staging) and runs on_done on the caller; small ones are
// copied first and never wait. kImmutableZeroCopy never aliases (device memory is not the
// caller's memory): it copies as kImmutableUntilTransferCompletes and counts ZeroCopyFallbacks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/device/client.h"
#include "ferry/device/registry.h"
#include "src/device/opencl/opencl_buffer.h"
#include "src/device/opencl/opencl_library.h"
#include "src/device/opencl/opencl_transfer.h"

namespace ferry::opencl {

class OpenClClient;

// What ferry reads from an OpenCL device to build its capability profile.
struct OpenClDeviceInfo {
  std::string description;           // "<device name> (<platform name>, <device version>)"
  bool opencl_1x = false;            // the platform predates OpenCL 2.0
  bool has_fp64 = false;             // cl_khr_fp64
  bool has_fp16 = false;             // cl_khr_fp16
  bool is_cpu = false;               // CL_DEVICE_TYPE_CPU (PoCL's device): memory is host memory
  int64_t global_memory_bytes = 0;   // CL_DEVICE_GLOBAL_MEM_SIZE
  int64_t max_allocation_bytes = 0;  // CL_DEVICE_MAX_MEM_ALLOC_SIZE
};

class OpenClDevice final : public Device {
 public:
  OpenClDevice(OpenClClient* client, int index, OpenClDeviceInfo info,
               DeviceCapabilities capabilities, std::shared_ptr<DeviceQueue> queue);

  Client* client() const override;
  int index() const override { return index_; }
  const std::string& name() const override { return name_; }
  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  int64_t bytes_in_use() const override { return memory_->in_use(); }
  // The cl_context, cl_device_id and the in-order cl_command_queue ferry uses.
  StatusOr<NativeDeviceHandles> NativeHandles() const override;

  const OpenClDeviceInfo& info() const { return info_; }
  const std::shared_ptr<DeviceQueue>& queue() const { return queue_; }
  const std::shared_ptr<MemoryAccount>& memory() const { return memory_; }
  StagingRing& ring() { return *ring_; }

  // Shuts the staging worker down, waits for the queue and frees the ring (the client's
  // destructor, after no more work can start).
  void ShutdownStaging();
  void FinishQueue();
  void DestroyRing() { ring_.reset(); }

 private:
  OpenClClient* const client_;
  const int index_;
  const std::string name_;
  const OpenClDeviceInfo info_;
  const DeviceCapabilities capabilities_;
  const std::shared_ptr<DeviceQueue> queue_;
  const std::shared_ptr<MemoryAccount> memory_;
  std::unique_ptr<StagingRing> ring_;
};

class OpenClClient final : public Client {
 public:
  // Opens the OpenCL library (FERRY_OPENCL_LIBRARY, else libOpenCL.so.1) and makes one device
  // per OpenCL device of every platform. Unavailable (naming what failed: no library, no
  // platform, no device) where OpenCL cannot run. `options.capabilities`, when given, narrows
  // the profile read from each device (dtypes intersected, limits lowered); `num_devices` and
  // `num_worker_threads` do not apply.
  static StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  // Cancels staged transfers that have not started, waits for every command and every event
  // callback (so every on_done has run and every Ready() has completed), then releases the
  // staging rings; buffers keep their own references to the device contexts.
  ~OpenClClient() override;

  std::string_view backend() const override { return "opencl"; }
  absl::Span<Device* const> devices() const override { return device_pointers_; }

  // A buffer larger than the device's max_buffer_bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE) is
  // ResourceExhausted, as is one that passes memory_limit_bytes (CL_DEVICE_GLOBAL_MEM_SIZE).
  StatusOr<std::unique_ptr<Buffer>> BufferFromHostBuffer(const HostView& src, DType device_dtype,
                                                         Device* device,
                                                         HostBufferSemantics semantics,
                                                         OnDoneWithHostBuffer on_done,
                                                         std::string_view tensor_name) override;
  // Each write is one blocking clEnqueueWriteBuffer at its offset, on the calling thread.
  StatusOr<std::unique_ptr<BufferWriter>> CreateBufferWriter(DType device_dtype, const Dims& dims,
                                                             Device* device,
                                                             std::string_view memory_kind,
                                                             std::string_view tensor_name) override;

 private:
  OpenClClient() : lifetime_(std::make_shared<ClientLifetime>("opencl")) {}

  std::shared_ptr<ClientLifetime> lifetime_;
  std::vector<std::unique_ptr<OpenClDevice>> devices_;
  std::vector<Device*> device_pointers_;
};

// The OpenCL objects behind `device` (its symbol table, cl_context and in-order cl_command_queue,
// through DeviceQueue's accessors), for code that issues its own commands next to ferry's, such
// as ferry-bench's raw clEnqueueWriteBuffer ceiling. nullptr when `device` is null or not an
// opencl device. The objects stay valid while the device's client lives; commands enqueued on
// the queue are ordered with ferry's own.
inline const DeviceQueue* DeviceQueueOf(const Device* device) {
  const auto* opencl_device = dynamic_cast<const OpenClDevice*>(device);
  return opencl_device == nullptr ? nullptr : opencl_device->queue().get();
}

}  // namespace ferry::opencl
