// The device API, part 1: host buffer semantics, device capabilities and `Device`.
//
// The device API is what every backend (host, opencl, ...) implements; it mirrors PJRT's
// `pjrt_client.h`. Ownership: a `Client` owns its `Device`s; everybody else holds non-owning
// `Device*` that stay valid for the life of the client.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/device/native_handles.h"

namespace ferry {

class Client;

// How long `BufferFromHostBuffer` may read (or keep) the caller's source memory.
enum class HostBufferSemantics {
  // ferry has finished reading the source when the call returns; `on_done` has run before it
  // returns, on the calling thread. The safe default.
  kImmutableOnlyDuringCall,
  // The call returns at once. The caller keeps the source unchanged and alive until `on_done`,
  // which runs exactly once, on a runtime thread, after the last byte was read.
  kImmutableUntilTransferCompletes,
  // The buffer may alias the source for its whole life (host device, same dtype, dense,
  // 64-byte aligned); then `on_done` runs once the buffer is destroyed and no read of it
  // (ToHost) is still running: on the thread that destroys the buffer, or on the runtime thread
  // that finishes the last such read. Where aliasing is impossible this behaves as
  // kImmutableUntilTransferCompletes and counts ZeroCopyFallbacks.
  kImmutableZeroCopy,
};

std::string_view HostBufferSemanticsName(HostBufferSemantics semantics);

// Runs exactly once when ferry no longer needs the source memory (see HostBufferSemantics).
using OnDoneWithHostBuffer = absl::AnyInvocable<void() &&>;

// What a device can hold.
struct DeviceCapabilities {
  std::bitset<kNumDTypes> dtypes{};  // the dtypes a buffer may have on the device
  // Bytes of device memory buffers may occupy together; nullopt means unlimited.
  std::optional<int64_t> memory_limit_bytes = std::nullopt;
  // The largest single buffer; nullopt means no limit beyond memory_limit_bytes.
  std::optional<int64_t> max_buffer_bytes = std::nullopt;

  // False for a value outside the enum (never an exception).
  bool Holds(DType dtype) const {
    const auto index = static_cast<size_t>(dtype);
    return index < dtypes.size() && dtypes.test(index);
  }
  // Every dtype.
  static DeviceCapabilities All();
  // Every dtype except f64 and c128 (like a TPU).
  static DeviceCapabilities No64BitFloats();
  // The dtypes held, in enum order.
  std::vector<DType> HeldDTypes() const;
};

// A memory space of a device (PJRT's PJRT_Memory): where a buffer's bytes live. Every device has
// one default space; accelerators add host memories the device reaches directly.
struct MemorySpace {
  // "device" (the device's own memory), "pinned_host", "unpinned_host", ... as the backend names
  // it.
  std::string kind;
  // The space buffers go to unless a kind is asked for.
  bool is_default = false;
};

// What a device's memory holds, in the manner of JAX's Device.memory_stats().
struct DeviceMemoryStats {
  enum class Source {
    kFerry,   // ferry's own count of its buffers (the same as Device::bytes_in_use)
    kPlugin,  // the runtime's allocator (pjrt: PJRT_Device_MemoryStats), others' buffers included
  };
  Source source = Source::kFerry;
  int64_t bytes_in_use = 0;
  std::optional<int64_t> peak_bytes_in_use;
  // The most the device's buffers may hold (ferry: DeviceCapabilities::memory_limit_bytes).
  std::optional<int64_t> bytes_limit;
};

std::string_view DeviceMemoryStatsSourceName(DeviceMemoryStats::Source source);  // "ferry"

class Device {
 public:
  virtual ~Device() = default;

  // The client that owns this device.
  virtual Client* client() const = 0;
  // Index among the client's devices (0-based).
  virtual int index() const = 0;
  // "<backend>:<index>", e.g. "host:0".
  virtual const std::string& name() const = 0;
  virtual const DeviceCapabilities& capabilities() const = 0;
  // Bytes currently held by this device's buffers (aliases excluded). A buffer's bytes leave it
  // when the buffer is destroyed and no read of it is still running: a read lets go of the
  // memory before its future completes, so destroying a buffer after its reads are done frees
  // its bytes at once.
  virtual int64_t bytes_in_use() const = 0;
  // The device's memory as its runtime counts it where the runtime can say (pjrt plugins with
  // PJRT_Device_MemoryStats, a GPU's allocator), else ferry's own count: bytes_in_use() and the
  // capabilities' memory limit. bytes_in_use() stays ferry's exact count of its own buffers.
  virtual DeviceMemoryStats memory_stats() const {
    DeviceMemoryStats stats;
    stats.bytes_in_use = bytes_in_use();
    stats.bytes_limit = capabilities().memory_limit_bytes;
    return stats;
  }
  // What the device is, in one line for people ("cpu (PJRT plugin xla_cpu_pjrt.so, API 0.81)");
  // empty where the name says it all.
  virtual std::string description() const { return std::string(); }
  // False for a device of another process of a multi-process job (distributed::RemoteDevice):
  // it has no client here (client() is null) and nothing can be sent to it or read from it.
  virtual bool is_addressable() const { return true; }
  // The memory spaces buffers of this device may live in, the default first; fixed for the
  // device's life (every transfer looks its space up here). Backends whose devices have one
  // memory keep this default: {"device", default}.
  virtual const std::vector<MemorySpace>& memory_spaces() const {
    static const std::vector<MemorySpace>* const kDeviceMemoryOnly =
        new std::vector<MemorySpace>{{"device", true}};
    return *kDeviceMemoryOnly;
  }
  // True when Buffer::CopyToDevice from this device to `target` copies between the devices
  // themselves (an accelerator's peer copy), not through the host: then a sharding's replicas are
  // copied from the first one instead of uploaded again.
  virtual bool CopiesBuffersTo(const Device* target) const {
    (void)target;
    return false;
  }
  // The runtime objects behind the device, for code that calls its runtime directly
  // (native_handles.h says what each is, per backend, and for how long it is valid).
  // Unimplemented on backends without any (host).
  virtual StatusOr<NativeDeviceHandles> NativeHandles() const;
};

// The memory space of `device` named `kind`; its default space for an empty `kind`.
// InvalidArgument listing the device's spaces when it has none of that kind.
StatusOr<MemorySpace> FindMemorySpace(const Device& device, std::string_view kind);

}  // namespace ferry
