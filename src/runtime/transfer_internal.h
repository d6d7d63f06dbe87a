// Internal to the runtime: the one place where host -> device transfers are started, shared by
// TransferToDevice (many sources, one device) and the sharded transfers (one source per device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "ferry/runtime/transfer.h"

namespace ferry::internal {

struct DeviceTransfer {
  std::shared_ptr<const TensorSource> source;
  Device* device = nullptr;           // never null: TransferToDevice and Mesh check it first
  std::optional<DType> device_dtype;  // nullopt: the device's profile decides
};

// Starts every transfer and returns one handle each, in order; all or nothing (see
// TransferToDevice). With kImmutableOnlyDuringCall the large sources (kOverlapMinBytes or more)
// are started asynchronously, all of them before waiting on any, and the call returns once every
// source has been read, so that the transfers overlap with each other rather than run one after
// the other; small ones run as kImmutableOnlyDuringCall (the backends copy them on the thread that
// starts them: this one, or for a large batch every core, see kParallelMinTransfers).
// Even on error, no source is read after this returns.
StatusOr<std::vector<DataPtr>> StartTransfers(absl::Span<const DeviceTransfer> transfers,
                                              HostBufferSemantics semantics);

inline constexpr int64_t kOverlapMinBytes = int64_t{1} << 20;

// Under kImmutableOnlyDuringCall, a batch with at least this many sources below kOverlapMinBytes
// starts them on every core (oneTBB), kParallelGrainTransfers per task: each is copied on the
// thread that starts it, and alone their per-tensor costs (allocation, plan, handle) add up on
// one core. The large sources are started first; the error reported is that of the first of them
// that fails, else that of the first small source in order that fails.
inline constexpr size_t kParallelMinTransfers = 256;
inline constexpr size_t kParallelGrainTransfers = 64;

}  // namespace ferry::internal
