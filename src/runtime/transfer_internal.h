// Internal to the runtime: the one place where host -> device transfers are started, shared by
// TransferToDevice (many sources, one device) and the sharded transfers (one source per device).
#pragma once

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
// the other; small ones run as kImmutableOnlyDuringCall (the backends copy them on this thread).
// Even on error, no source is read after this returns.
StatusOr<std::vector<DataPtr>> StartTransfers(absl::Span<const DeviceTransfer> transfers,
                                              HostBufferSemantics semantics);

inline constexpr int64_t kOverlapMinBytes = int64_t{1} << 20;

}  // namespace ferry::internal
