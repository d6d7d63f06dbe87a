// The pjrt backend's buffers: a ferry Buffer over one PJRT_Buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "ferry/core/future.h"
#include "ferry/device/buffer.h"
#include "ferry/device/memory_account.h"
#include "src/device/device_allocation.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/transfer_engine.h"

namespace ferry::pjrt {

class PjrtDevice;
class PjrtClient;

// Owns one PJRT_Buffer and destroys it when the last holder lets go: the ferry buffer holds it,
// and so does every read in flight, so the plugin's memory (or, for a zero-copy alias, the
// caller's memory, released by on_done at PJRT_Buffer_Destroy) outlives every read of it. Holds
// the runtime, so the PJRT client outlives its buffers.
class PjrtBufferHandle {
 public:
  PjrtBufferHandle(std::shared_ptr<PjrtRuntime> runtime, PJRT_Buffer* buffer)
      : runtime_(std::move(runtime)), buffer_(buffer) {}
  ~PjrtBufferHandle();
  PjrtBufferHandle(const PjrtBufferHandle&) = delete;
  PjrtBufferHandle& operator=(const PjrtBufferHandle&) = delete;

  PJRT_Buffer* get() const { return buffer_; }
  const PjrtRuntime& runtime() const { return *runtime_; }

 private:
  const std::shared_ptr<PjrtRuntime> runtime_;
  PJRT_Buffer* const buffer_;
};

// Bytes reserved on a device's MemoryAccount for a buffer the plugin allocated; released on
// destruction.
class AccountedBytes {
 public:
  AccountedBytes(std::shared_ptr<MemoryAccount> account, int64_t bytes)
      : account_(std::move(account)), bytes_(bytes) {}
  ~AccountedBytes() { account_->Release(bytes_); }
  AccountedBytes(const AccountedBytes&) = delete;
  AccountedBytes& operator=(const AccountedBytes&) = delete;

 private:
  const std::shared_ptr<MemoryAccount> account_;
  const int64_t bytes_;
};

// What a PjrtBuffer is made of; see PjrtBuffer's constructor.
struct PjrtBufferParts {
  std::shared_ptr<PjrtBufferHandle> handle;
  DType device_dtype = DType::kF32;
  Dims dims;
  Future<> ready;
  // The device memory when the host may address it (ferry's own allocation on the direct path,
  // the plugin's pointer otherwise on a CPU plugin, the caller's memory for an alias); else null.
  std::byte* host_address = nullptr;
  // Keeps ferry's own device memory (direct path) or the plugin allocation's accounting alive.
  std::shared_ptr<void> memory_keepalive;
  bool is_alias = false;
  // The PJRT memory kind it lives in.
  std::string memory_kind = "device";
};

class PjrtBuffer final : public Buffer {
 public:
  PjrtBuffer(PjrtDevice* device, PjrtBufferParts parts);
  ~PjrtBuffer() override = default;

  Device* device() const override;
  DType device_dtype() const override { return parts_.device_dtype; }
  const Dims& dims() const override { return parts_.dims; }
  int64_t size_bytes() const override { return size_bytes_; }
  bool is_alias() const override { return parts_.is_alias; }
  std::string memory_kind() const override { return parts_.memory_kind; }
  Future<> Ready() const override { return parts_.ready; }
  // After Ready(): where the host can address the device memory, one pass of the fused
  // copy-convert into `dst` (on the transfer engine when large); else the plugin's ToHostBuffer
  // straight into `dst` when it is dense in the device dtype (started on the device's
  // device-to-host staging worker, finished by the plugin's event), or partial reads
  // (PJRT_Buffer_CopyRawToHost) into staging chunks, started on that worker, each converted
  // into `dst` where its event completes (a plugin thread).
  // Completes on the thread that finished the last piece (an engine worker, the staging worker
  // or a plugin thread).
  Future<> ToHost(const MutableHostView& dst) override;
  // A read-only view of the device memory where the host can address it (CPU plugins).
  StatusOr<HostView> HostAccessibleView() const override;
  // Host memory where HostAccessibleView() has it; the plugin's device pointer on a CUDA or ROCm
  // plugin (PJRT_Buffer_OpaqueDeviceMemoryDataPointer, else PJRT_Buffer_UnsafePointer), with the
  // device's PJRT_Device_LocalHardwareId as its ordinal. Unimplemented otherwise (the CPU plugin
  // without direct host access: its events may complete before its copies land, so only its own
  // reads are ordered after them).
  StatusOr<BufferAddress> DataAddress() const override;
  // The PJRT_Buffer.
  StatusOr<NativeBufferHandle> NativeHandle() const override;
  // From the device memory where the host addresses it; else the plugin's partial read
  // (PJRT_Buffer_CopyRawToHost, started on the device's device-to-host staging worker and
  // finished by the plugin's event, on the plugin's thread). Never
  // waits for Ready() on the calling thread: a read of a buffer whose put is still running starts
  // on that worker once the put has finished.
  Future<> CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) override;
  // PJRT_Buffer_CopyToDevice on the plugin when `target` is a device of the same client (and the
  // plugin has it); through the host otherwise.
  StatusOr<std::unique_ptr<Buffer>> CopyToDevice(Device* target) override;

  PJRT_Buffer* pjrt_buffer() const { return parts_.handle->get(); }

  // What a read needs, copied into reads that start later: a read never touches the PjrtBuffer
  // itself, which may be destroyed first.
  struct ReadSource {
    PjrtBufferParts parts;
    std::string device_name;
    std::shared_ptr<ClientLifetime> lifetime;
    // Used only while a token of `lifetime` is held (the client owns its devices).
    PjrtClient* client;
    const PjrtDevice* device;
    int64_t size_bytes;
  };

 private:
  // Where the host addresses the memory (the direct path, an alias): the PJRT buffer and ferry's
  // allocation behind it.
  std::shared_ptr<const void> HoldHostAccessibleMemory() const override;

  class Read;
  // CopyRawToHost of a buffer whose Ready() has completed, from what a read holds.
  static Future<> CopyRawOnceReady(const ReadSource& source, int64_t offset_bytes,
                                   int64_t size_bytes, void* dst, ClientLifetime::Token token);
  // Starts `read` (after Ready()) and finishes it, or hands it to a piece that will (every piece
  // that outlives the call holds `read`). An error when it could not start. `on_worker` when this
  // runs on the device's device-to-host staging worker (reads that wait go there).
  static Status StartRead(const std::shared_ptr<Read>& read, bool on_worker);

  PjrtDevice* const device_;
  const ReadSource source_;
  const PjrtBufferParts& parts_ = source_.parts;
  const std::string& device_name_ = source_.device_name;
  const std::shared_ptr<ClientLifetime>& lifetime_ = source_.lifetime;
  const int64_t& size_bytes_ = source_.size_bytes;
};

}  // namespace ferry::pjrt
