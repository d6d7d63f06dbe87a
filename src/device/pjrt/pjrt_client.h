// The pjrt backend: devices of any PJRT C API plugin ("pjrt:0", ...), the XLA CPU plugin here and
// the CUDA or TPU plugins elsewhere, loaded at run time (pjrt_library.h). Without a plugin the
// factory returns Unavailable with the reason and the rest of ferry works as before.
//
// Host -> device, per source (docs/pjrt.md has the measurements behind each choice):
// - kImmutableZeroCopy of a dense, native, 64-byte-aligned source in the device dtype, on a
//   plugin whose buffers are in host memory: the plugin's own BufferFromHostBuffer with ZeroCopy
//   (the CPU plugin aliases it); on_done runs from the plugin's done_with_host_buffer event (at
//   the buffer's destruction when it aliases). A plugin that copied instead (the buffer's address
//   is not the source's) holds device memory: it is reserved after the call and the put counts
//   as a ZeroCopyFallbacks. Any other zero-copy put (every GPU plugin: ferry cannot see its
//   buffers) is a kImmutableUntilTransferCompletes put, reserved up front, and a fallback.
// - direct host access (the plugin's buffers are on the CPU, and
//   ClientOptions::pjrt_direct_host_access is not false): ferry allocates the device memory from
//   its warm cache, writes it with the fused copy-convert (any strides, any conversion) on the
//   transfer engine's threads, and hands the plugin a view of it (CreateViewOfDeviceBuffer,
//   whose on_delete gives the memory back). The plugin's own upload writes fresh pages every time.
// - same dtype, native byte order, strides in whole elements: the plugin's BufferFromHostBuffer
//   with the source's byte strides; on_done from done_with_host_buffer.
// - anything else (a conversion, a byte-swapped file, odd strides): chunks of the device's
//   host-to-device staging ring (src/device/staging_ring.h, shared with OpenCL) filled by the
//   fused copy-convert and fed to the plugin's transfer manager
//   (CreateBuffersForAsyncHostToDevice + TransferData): never a full-size temporary.
// Every argument is checked before it reaches the plugin (the plugins crash on bad input).
//
// Threads: the plugin's event continuations run on_done and complete Ready() (PJRT's own
// threads: the GIL deadlock path, for real); staged asynchronous transfers, and reads the host
// cannot address, run on their device's staging worker for that direction (one thread per device
// and direction, started on first use); the direct path on the transfer engine's workers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/device/client.h"
#include "ferry/device/memory_account.h"
#include "ferry/device/registry.h"
#include "src/device/pjrt/pjrt_host_services.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/staging_ring.h"
#include "src/device/transfer_engine.h"

namespace ferry::pjrt {

class PjrtClient;

// The PJRT element type of `dtype` (every ferry dtype has one).
PJRT_Buffer_Type ToPjrtType(DType dtype);

// What ferry learned about a plugin and its devices when the client started.
struct PjrtPlatformInfo {
  std::string plugin_path;
  int api_major = 0;
  int api_minor = 0;
  std::string platform_name;     // "cpu", "cuda", "tpu"
  std::string platform_version;  // the plugin's own words
  // The plugin's buffers live in host memory (PJRT_Buffer_IsOnCpu of a probe buffer).
  bool buffers_on_cpu = false;
  // The plugin lays its buffers out as dense row-major arrays (a 2-d probe buffer's
  // PJRT_Buffer_GetMemoryLayout is row-major and untiled; without that entry, the CPU and GPU
  // platforms' known default) and ClientOptions::pjrt_row_major_layouts allows relying on it.
  // Every raw path needs it: partial reads and chunked writes at byte offsets, direct host access,
  // zero-copy aliases, device pointers. Without it each transfer takes the plugin's own
  // layout-aware entries: ToHostBuffer with a row-major host_layout (into a dense temporary when
  // the destination is strided or of another dtype), BufferFromHostBuffer (from a converted dense
  // temporary when the device stores another dtype).
  bool row_major_layouts = false;
  // ferry writes and reads device memory itself (buffers_on_cpu, row_major_layouts, the entries it
  // needs are there, and ClientOptions::pjrt_direct_host_access allows it).
  bool direct_host_access = false;
  // The plugin has the transfer manager entries (create-then-fill in chunks).
  bool has_transfer_manager = false;
  // The plugin has PJRT_Buffer_CopyRawToHost (partial reads).
  bool has_raw_reads = false;

  // Partial reads at byte offsets of the row-major array (CopyRawToHost) may be used.
  bool reads_at_byte_offsets() const { return has_raw_reads && row_major_layouts; }
  // Chunked writes at byte offsets of the row-major array (the transfer manager) may be used.
  bool writes_at_byte_offsets() const { return has_transfer_manager && row_major_layouts; }
};

// One of a device's PJRT memories.
struct PjrtMemorySpace {
  std::string kind;
  PJRT_Memory* memory = nullptr;
};

// Where the device pointers of a plugin's buffers point, by the platform it names ("cuda", "rocm");
// nullopt for platforms whose buffers are not addressed by a pointer ferry may hand out (a TPU) or
// are host memory ("cpu": Buffer::DataAddress gives those only where ferry reads them itself).
std::optional<AddressSpace> DeviceAddressSpaceOf(std::string_view platform_name);

// The two directions a device's staged transfers go in; each has its own staging ring and worker,
// as PJRT's own clients keep a host-to-device and a device-to-host stream per device.
enum class StagingDirection { kHostToDevice, kDeviceToHost };

class PjrtDevice final : public Device {
 public:
  PjrtDevice(PjrtClient* client, int index, PJRT_Device* device, PJRT_Memory* default_memory,
             std::string kind, std::vector<PjrtMemorySpace> memories,
             DeviceCapabilities capabilities);

  Client* client() const override;
  int index() const override { return index_; }
  const std::string& name() const override { return name_; }
  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  int64_t bytes_in_use() const override { return memory_->in_use(); }
  // The plugin's PJRT_Device_MemoryStats where it answers (a GPU allocator's), else ferry's count.
  DeviceMemoryStats memory_stats() const override;
  std::string description() const override;
  // The plugin's addressable memories, its default memory first.
  const std::vector<MemorySpace>& memory_spaces() const override { return memory_spaces_; }
  // To another device of this client when the plugin copies between its devices
  // (PJRT_Buffer_CopyToDevice) and ferry does not own the memory (no direct host access).
  bool CopiesBuffersTo(const Device* target) const override;
  // The plugin's PJRT_Api, PJRT_Client, PJRT_Device and default PJRT_Memory.
  StatusOr<NativeDeviceHandles> NativeHandles() const override;

  PJRT_Device* pjrt_device() const { return device_; }
  // The device's default memory space; null when the plugin has no memories (older plugins).
  PJRT_Memory* default_memory() const { return default_memory_; }
  const std::string& kind() const { return kind_; }
  // The PJRT memory of `kind` (the default for an empty kind); null when there is none.
  PJRT_Memory* FindMemory(std::string_view kind) const;
  const std::shared_ptr<MemoryAccount>& memory() const { return memory_; }
  // This device's staging ring for `direction` (host chunks, registered with the plugin for DMA
  // where it pins: PjrtStagingPinning; src/device/staging_ring.h) and its worker: staged puts to
  // the device and reads the host cannot address, each device and direction on a thread of its
  // own, so that one device's reads never queue behind another's (or behind its own puts). The
  // chunks and the thread are made on first use.
  StagingRing& staging(StagingDirection direction) const {
    return *staging_[static_cast<int>(direction)];
  }
  // Runs `job` on that ring's worker (work that may wait for staging chunks or for a plugin
  // event, and so must not run on a plugin thread). FailedPrecondition once the client is
  // shutting down.
  Status RunOnStagingWorker(StagingDirection direction, StagingRing::Job job) const {
    return staging(direction).Submit(std::move(job));
  }
  // Stops both rings' workers (the client's shutdown); the chunks go with the device.
  void ShutdownStaging();

 private:
  PjrtClient* const client_;
  const int index_;
  const std::string name_;
  PJRT_Device* const device_;
  PJRT_Memory* const default_memory_;
  const std::string kind_;
  const std::vector<PjrtMemorySpace> memories_;
  const std::vector<MemorySpace> memory_spaces_;  // memories_ as MemorySpaces, the default first
  const DeviceCapabilities capabilities_;
  const std::shared_ptr<MemoryAccount> memory_;
  const std::array<std::unique_ptr<StagingRing>, 2> staging_;
};

class PjrtClient final : public Client {
 public:
  // Finds and loads the plugin (options.pjrt_plugin, FERRY_PJRT_PLUGIN, else the first installed
  // one), creates its client with options.plugin_options (and `cpu_device_count` =
  // options.num_devices when that is given and the options do not name it) and makes one ferry
  // device per addressable PJRT device (the first num_devices of them when that is given).
  // Unavailable when there is no plugin or it cannot start; InvalidArgument for options the
  // plugin would crash on (a negative cpu_device_count).
  static StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  // Stops new work, cancels staged transfers that have not started, waits for every transfer
  // and callback in flight (every on_done has run, every Ready() has completed), then lets go of
  // the PJRT client; buffers that outlive this keep it (and only it) alive, and their calls fail
  // with FailedPrecondition.
  ~PjrtClient() override;

  std::string_view backend() const override { return "pjrt"; }
  absl::Span<Device* const> devices() const override { return device_pointers_; }

  StatusOr<std::unique_ptr<Buffer>> BufferFromHostBuffer(const HostView& src, DType device_dtype,
                                                         Device* device,
                                                         HostBufferSemantics semantics,
                                                         OnDoneWithHostBuffer on_done,
                                                         std::string_view tensor_name) override;
  // Through the plugin's transfer manager, into the PJRT memory of that kind.
  StatusOr<std::unique_ptr<BufferWriter>> CreateBufferWriter(DType device_dtype, const Dims& dims,
                                                             Device* device,
                                                             std::string_view memory_kind,
                                                             std::string_view tensor_name) override;

  const PjrtPlatformInfo& platform() const { return platform_; }
  const std::shared_ptr<PjrtRuntime>& runtime() const { return runtime_; }
  // The CPU copy engine (src/device/transfer_engine.h) for memory the host addresses; null when
  // the plugin's buffers are not in host memory (platform().buffers_on_cpu is false), which never
  // hands the host an address to copy from.
  const std::shared_ptr<TransferEngine>& engine() const { return engine_; }
  // Whether the staging rings' chunks are pinned by the plugin (made by Initialize, before the
  // devices).
  const std::shared_ptr<const PjrtStagingPinning>& staging_pinning() const {
    return staging_pinning_;
  }

 private:
  explicit PjrtClient(std::shared_ptr<PjrtRuntime> runtime, int num_workers);
  // Fills platform_ and makes the devices, through the three steps below in this order.
  Status Initialize(const ClientOptions& options);
  // What the plugin says of itself and which optional entries it has, into platform_.
  Status ReadPlatformInfo();
  // One PjrtDevice per addressable PJRT device (the first options.num_devices of them when that
  // is given), owned by devices_. Unavailable when that leaves none.
  Status AddDevices(const ClientOptions& options);
  // platform_.buffers_on_cpu and platform_.row_major_layouts, from a 3x5 buffer put on the first
  // device and destroyed before this returns (buffers_on_cpu false when the plugin cannot say).
  Status ProbeBuffers();
  // Where the plugin keeps `buffer` in host memory: only where its buffers are on the CPU and it
  // can tell; null otherwise. The plugin owns that memory, valid while `buffer` lives.
  std::byte* HostAddressOf(PJRT_Buffer* buffer) const;

  // The plugin's BufferFromHostBuffer of `src` as it is (its dtype is the device's). Counts no
  // transfer metric: its callers count the put as the direct or converted one it is.
  StatusOr<std::unique_ptr<Buffer>> PutThroughPlugin(const HostView& src, PjrtDevice* device,
                                                     HostBufferSemantics semantics,
                                                     OnDoneWithHostBuffer on_done,
                                                     std::string_view tensor_name);
  StatusOr<std::unique_ptr<Buffer>> PutDirect(const HostView& src, DType device_dtype,
                                              PjrtDevice* device, HostBufferSemantics semantics,
                                              OnDoneWithHostBuffer on_done,
                                              std::string_view tensor_name);
  // Converting or re-striding puts where the staged path cannot run (the plugin's layouts are not
  // row-major, or it has no transfer manager): the source converted into a dense temporary in the
  // device dtype, which the plugin's BufferFromHostBuffer lays out.
  StatusOr<std::unique_ptr<Buffer>> PutConvertedThroughPlugin(
      const HostView& src, DType device_dtype, PjrtDevice* device, HostBufferSemantics semantics,
      OnDoneWithHostBuffer on_done, std::string_view tensor_name);
  // Converting or re-striding puts: the source streamed through the staging ring into a writer
  // (StartWriter), one TransferData per chunk.
  StatusOr<std::unique_ptr<Buffer>> PutStaged(const HostView& src, DType device_dtype,
                                              PjrtDevice* device, HostBufferSemantics semantics,
                                              OnDoneWithHostBuffer on_done,
                                              std::string_view tensor_name);
  // A create-then-fill writer over the plugin's transfer manager (CreateBufferWriter). With
  // `also_wait_for`, the buffer's Ready() completes only once that future has too (PutStaged's
  // `on_done`). A `held` token makes the writer's writes part of that operation (PutStaged's), so
  // they proceed while the client is closing; without one each write is an operation of its own.
  StatusOr<std::unique_ptr<BufferWriter>> StartWriter(DType device_dtype, const Dims& dims,
                                                      Device* device, std::string_view memory_kind,
                                                      std::string_view tensor_name,
                                                      std::optional<Future<>> also_wait_for,
                                                      ClientLifetime::Token held);

  const std::shared_ptr<PjrtRuntime> runtime_;
  PjrtPlatformInfo platform_;
  std::vector<std::unique_ptr<PjrtDevice>> devices_;
  std::vector<Device*> device_pointers_;
  const int num_workers_;
  // Made by Initialize when the plugin's buffers are in host memory; see engine().
  std::shared_ptr<TransferEngine> engine_;
  std::shared_ptr<const PjrtStagingPinning> staging_pinning_;
};

}  // namespace ferry::pjrt
