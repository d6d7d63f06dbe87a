#include "src/device/pjrt/pjrt_host_services.h"

#include <cstddef>
#include <utility>

#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "fmt/format.h"

namespace ferry::pjrt {
namespace {

// The probe: one page-sized allocation is enough to learn whether the plugin pins at all.
constexpr int64_t kProbeBytes = 4096;

Gauge* PinnedStagingBytes() {
  static Gauge* gauge = GetGauge("PjrtStagingBytesPinned", MetricUnit::kBytes);
  return gauge;
}

Gauge* PageableStagingBytes() {
  static Gauge* gauge = GetGauge("PjrtStagingBytesPageable", MetricUnit::kBytes);
  return gauge;
}

}  // namespace

PjrtStagingPinning::PjrtStagingPinning(std::shared_ptr<PjrtRuntime> runtime)
    : runtime_(std::move(runtime)) {
  const PjrtLibrary& library = runtime_->library();
  if (!FERRY_PJRT_HAS(library, PJRT_Client_DmaMap) ||
      !FERRY_PJRT_HAS(library, PJRT_Client_DmaUnmap)) {
    why_pageable_ = "the plugin has no PJRT_Client_DmaMap";
    return;
  }
  std::byte* probe = AllocateHostMemory(kProbeBytes);
  if (probe == nullptr) {
    why_pageable_ = "no host memory for the DmaMap probe";
    return;
  }
  if (Status mapped = Map(probe, kProbeBytes); mapped.ok()) {
    pins_ = true;
    Unmap(probe);
  } else {
    why_pageable_ = std::string(mapped.message());
  }
  FreeHostMemory(probe, kProbeBytes);
}

Status PjrtStagingPinning::Map(void* data, size_t bytes) const {
  auto args = FERRY_PJRT_ARGS(PJRT_Client_DmaMap_Args);
  args.client = runtime_->client();
  args.data = data;
  args.size = bytes;
  return runtime_->Check(runtime_->api().PJRT_Client_DmaMap(&args), "PJRT_Client_DmaMap");
}

void PjrtStagingPinning::Unmap(void* data) const {
  auto args = FERRY_PJRT_ARGS(PJRT_Client_DmaUnmap_Args);
  args.client = runtime_->client();
  args.data = data;
  // Nothing to do about a failure: the memory is freed next either way.
  runtime_->Check(runtime_->api().PJRT_Client_DmaUnmap(&args), "PJRT_Client_DmaUnmap")
      .IgnoreError();
}

StagingChunkAllocator PjrtStagingPinning::Allocator(
    std::shared_ptr<const PjrtStagingPinning> pinning) {
  StagingChunkAllocator allocator;
  allocator.allocate = [pinning](int64_t bytes) -> StatusOr<StagingChunk> {
    std::byte* host = AllocateHostMemory(bytes);
    if (host == nullptr) {
      return ResourceExhaustedError(
          fmt::format("could not allocate a staging chunk of {} bytes of host memory", bytes));
    }
    // `native` marks a pinned chunk (the plugin keeps no handle of its own: the address is it).
    const bool pinned = pinning->pins() && pinning->Map(host, static_cast<size_t>(bytes)).ok();
    (pinned ? PinnedStagingBytes() : PageableStagingBytes())->Add(bytes);
    StagingChunk chunk;
    chunk.host = host;
    chunk.native = pinned ? host : nullptr;
    return chunk;
  };
  allocator.free = [pinning](const StagingChunk& chunk, int64_t bytes) {
    const bool pinned = chunk.native != nullptr;
    if (pinned) pinning->Unmap(chunk.host);
    (pinned ? PinnedStagingBytes() : PageableStagingBytes())->Add(-bytes);
    FreeHostMemory(chunk.host, bytes);
  };
  return allocator;
}

std::optional<DeviceMemoryStats> PluginMemoryStats(const PjrtRuntime& runtime,
                                                   PJRT_Device* device) {
  if (!FERRY_PJRT_HAS(runtime.library(), PJRT_Device_MemoryStats)) return std::nullopt;
  auto args = FERRY_PJRT_ARGS(PJRT_Device_MemoryStats_Args);
  args.device = device;
  if (!runtime.Check(runtime.api().PJRT_Device_MemoryStats(&args), "PJRT_Device_MemoryStats")
           .ok()) {
    return std::nullopt;
  }
  DeviceMemoryStats stats;
  stats.source = DeviceMemoryStats::Source::kPlugin;
  stats.bytes_in_use = args.bytes_in_use;
  if (args.peak_bytes_in_use_is_set) stats.peak_bytes_in_use = args.peak_bytes_in_use;
  if (args.bytes_limit_is_set) stats.bytes_limit = args.bytes_limit;
  return stats;
}

}  // namespace ferry::pjrt
