// The host backend: the embedded default device. Device memory is host memory owned by the
// device, written by an asynchronous TransferEngine, so the asynchronous, lifetime and GIL paths
// are exercised for real on every machine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/device/client.h"
#include "ferry/device/registry.h"
#include "src/device/host/host_buffer.h"
#include "src/device/transfer_engine.h"

namespace ferry::host {

class HostClient;

class HostDevice final : public Device {
 public:
  HostDevice(HostClient* client, int index, DeviceCapabilities capabilities);

  Client* client() const override;
  int index() const override { return index_; }
  const std::string& name() const override { return name_; }
  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  int64_t bytes_in_use() const override { return memory_->in_use(); }

  const std::shared_ptr<MemoryAccount>& memory() const { return memory_; }

 private:
  HostClient* const client_;
  const int index_;
  const std::string name_;
  const DeviceCapabilities capabilities_;
  const std::shared_ptr<MemoryAccount> memory_;
};

class HostClient final : public Client {
 public:
  // Transfers below this many source bytes with kImmutableOnlyDuringCall run on the caller's
  // thread: a hop to a worker would cost more than the copy.
  static constexpr int64_t kInlineCopyBytes = int64_t{256} << 10;

  static StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~HostClient() override;

  std::string_view backend() const override { return "host"; }
  absl::Span<Device* const> devices() const override { return device_pointers_; }

  StatusOr<std::unique_ptr<Buffer>> BufferFromHostBuffer(const HostView& src, DType device_dtype,
                                                         Device* device,
                                                         HostBufferSemantics semantics,
                                                         OnDoneWithHostBuffer on_done,
                                                         std::string_view tensor_name) override;
  // Writes land in the buffer's memory on the calling thread (a memcpy).
  StatusOr<std::unique_ptr<BufferWriter>> CreateBufferWriter(DType device_dtype, const Dims& dims,
                                                             Device* device,
                                                             std::string_view memory_kind,
                                                             std::string_view tensor_name) override;

 private:
  HostClient(int num_devices, const DeviceCapabilities& capabilities, int num_workers);

  std::vector<std::unique_ptr<HostDevice>> devices_;
  std::vector<Device*> device_pointers_;
  std::shared_ptr<TransferEngine> engine_;
};

}  // namespace ferry::host
