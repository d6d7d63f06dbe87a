// Internal to the runtime: the one place where host -> device transfers are started, shared by
// TransferToDevice (many sources, one device) and the sharded transfers (one source per device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/future.h"
#include "ferry/core/host_tensor.h"
#include "ferry/runtime/transfer.h"

namespace ferry::internal {

struct DeviceTransfer {
  std::shared_ptr<const TensorSource> source;
  Device* device = nullptr;           // never null: TransferToDevice and Mesh check it first
  std::optional<DType> device_dtype;  // nullopt: the device's profile decides
  std::string memory_kind;            // empty: the device's default memory space
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

// The host tensors that device -> host reads write into, together with those reads: the one owner
// of read destinations in the runtime (TransferFromDevice, AssembleShards). Its destructor waits
// for every read it holds before it frees the tensors, so a call that returns early, on any path
// (an error later in the batch, an allocation that fails), can never free memory that a read it
// already started still writes into. Not thread-safe: one caller builds and consumes it.
class PendingReads {
 public:
  PendingReads() = default;
  PendingReads(const PendingReads&) = delete;
  PendingReads& operator=(const PendingReads&) = delete;
  // Waits for every read not yet awaited, then frees the tensors still held.
  ~PendingReads();

  // Takes `tensor` and returns it; the reference (and the tensor's memory) stays valid until
  // TakeTensors or destruction.
  HostTensor& Hold(HostTensor tensor);
  // Records a started read into memory of a held tensor.
  void Add(Future<> read) { reads_.push_back(std::move(read)); }
  // Waits for every read, in the order added; one status each.
  std::vector<Status> AwaitAll();
  // After AwaitAll: hands over the held tensors, in the order held.
  std::vector<HostTensor> TakeTensors();

 private:
  std::deque<HostTensor> tensors_;  // a deque: Hold's references survive later Holds
  std::vector<Future<>> reads_;
};

inline constexpr int64_t kOverlapMinBytes = int64_t{1} << 20;

// Under kImmutableOnlyDuringCall, a batch with at least this many sources below kOverlapMinBytes
// starts them on every core (oneTBB), kParallelGrainTransfers per task: each is copied on the
// thread that starts it, and alone their per-tensor costs (allocation, plan, handle) add up on
// one core. The large sources are started first; the error reported is that of the first of them
// that fails, else that of the first small source in order that fails.
inline constexpr size_t kParallelMinTransfers = 256;
inline constexpr size_t kParallelGrainTransfers = 64;

}  // namespace ferry::internal
