// What a PJRT plugin may offer the host side of ferry's transfers, used where it has it:
//
// - Pinned staging (PJRT_Client_DmaMap / DmaUnmap): a GPU plugin registers host memory for DMA
//   (cudaHostRegister), so a transfer from a staging chunk runs at the bus's rate instead of going
//   through the runtime's own bounce buffer. PjrtStagingPinning asks once, when the client starts,
//   with a probe allocation; a plugin without the entries, or that answers UNIMPLEMENTED (the XLA
//   CPU plugin), gets ferry's pageable staging memory, and the staging rings' chunks say which
//   they are in the metrics (PjrtStagingBytesPinned / PjrtStagingBytesPageable).
// - Device memory statistics (PJRT_Device_MemoryStats): the allocator's own bytes in use, peak
//   and limit, for Device::memory_stats(); nullopt where the plugin has no such entry or answers
//   UNIMPLEMENTED, and then the device reports ferry's own count.
//
// Threads: every function may be called from any thread. Ownership: a PjrtStagingPinning holds
// the runtime (and so the PJRT client) alive for as long as a chunk it registered may still be
// unregistered.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ferry/device/device.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/device/staging_ring.h"

namespace ferry::pjrt {

class PjrtStagingPinning {
 public:
  // Probes the plugin (one small host allocation, DmaMap, DmaUnmap) and remembers the answer.
  explicit PjrtStagingPinning(std::shared_ptr<PjrtRuntime> runtime);

  // True when the plugin registered the probe for DMA: staging chunks will be pinned.
  bool pins() const { return pins_; }
  // Why staging is pageable, in a few words ("the plugin has no PJRT_Client_DmaMap", the
  // plugin's own UNIMPLEMENTED message); empty when it pins.
  const std::string& why_pageable() const { return why_pageable_; }

  // Chunks of ferry's host memory, each registered with the plugin when pins(); a chunk whose
  // registration fails (the plugin out of pinnable memory) stays pageable and still works. The
  // allocator keeps this object alive.
  static StagingChunkAllocator Allocator(std::shared_ptr<const PjrtStagingPinning> pinning);

 private:
  // DmaMap of [data, data + bytes); OK when registered.
  Status Map(void* data, size_t bytes) const;
  void Unmap(void* data) const;

  const std::shared_ptr<PjrtRuntime> runtime_;
  bool pins_ = false;
  std::string why_pageable_;
};

// The plugin's PJRT_Device_MemoryStats of `device` as a DeviceMemoryStats (source kPlugin);
// nullopt when the plugin has no such entry or cannot answer (UNIMPLEMENTED, any error).
std::optional<DeviceMemoryStats> PluginMemoryStats(const PjrtRuntime& runtime, PJRT_Device* device);

}  // namespace ferry::pjrt
