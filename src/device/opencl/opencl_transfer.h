// The opencl backend's transfer machinery, shared by both directions: which path a host view
// takes (direct, rectangular, staged), completion from OpenCL event callbacks, and the pinned
// staging ring (the device-level StagingRing with OpenCL chunks and commands).
//
// Threads. Event callbacks run on the OpenCL runtime's own threads (PoCL: its device worker
// threads, between commands). A callback here never calls a blocking OpenCL function, never
// waits for a staging chunk and never takes a lock that a waiting thread holds: it returns its
// chunk to the ring, converts a read chunk into its destination, and completes promises (which
// runs the caller's `on_done` and future callbacks). Everything that may wait (for a free chunk,
// for an event) runs on a caller thread (kImmutableOnlyDuringCall only) or on the ring's worker.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "src/device/opencl/opencl_buffer.h"
#include "src/device/opencl/opencl_library.h"
#include "src/device/piece_counter.h"
#include "src/device/staging_ring.h"

namespace ferry::opencl {

// Transfers of at most this many bytes (source or device side, whichever is larger) that need
// staging, and every kImmutableOnlyDuringCall transfer this small, are copied on the calling
// thread into a temporary host block that the write then reads: the call never waits.
inline constexpr int64_t kInlineCopyBytes = int64_t{256} << 10;

// ---------------------------------------------------------------------------------------------
// Paths.

// A host view as OpenCL's rectangular copies see it: `region` in bytes/rows/slices and the host
// pitches; the device side is dense.
struct RectLayout {
  std::array<size_t, 3> region = {0, 1, 1};
  size_t host_row_pitch = 0;
  size_t host_slice_pitch = 0;
};

enum class PathKind {
  kDense,  // one contiguous run in the device dtype: clEnqueueWrite/ReadBuffer
  kRect,   // 2-D or 3-D with positive strides, rows contiguous: clEnqueueWrite/ReadBufferRect
  kStaged  // anything else (conversion, other strides): staging and the fused copy-convert
};

struct TransferPath {
  PathKind kind = PathKind::kStaged;
  RectLayout rect;  // for kRect
};

// The path for moving `view` to or from a dense device buffer of `device_dtype`. Dims of size 1
// are dropped and dims contiguous together are merged first, so a dense view with a size-1 dim
// of any stride is still kDense. Requires a validated, non-empty view.
TransferPath ChooseTransferPath(const HostView& view, DType device_dtype);

// ---------------------------------------------------------------------------------------------
// Completion.

// The status of a completed command's event: OK for CL_COMPLETE, else Internal naming the
// OpenCL error, the `operation` and `what` it was for.
Status EventStatus(cl_int execution_status, std::string_view operation, std::string_view what);

class EventGate;

// Takes over the caller's reference to `event` and runs `on_complete(execution_status)` once
// the command has completed, from the runtime's event callback thread. If the callback cannot be
// registered, opens `gate` (the one the command waits for, if any), waits for the event here and
// runs `on_complete` on this thread.
void OnEventComplete(const OpenClLibrary& cl, cl_event event,
                     absl::AnyInvocable<void(cl_int) &&> on_complete, EventGate* gate = nullptr);

// Waits for `event` on this thread, releases it and returns its execution status (or the error of
// the wait itself).
cl_int WaitForEvent(const OpenClLibrary& cl, cl_event event);

// A user event that holds back the commands that wait on it until Open(), so that a command
// cannot complete (and its callback cannot run inline on this thread) before its callback is
// registered. Open() is idempotent and also runs on destruction.
class EventGate {
 public:
  static StatusOr<EventGate> Create(const DeviceQueue& queue, std::string_view what);
  EventGate(EventGate&& other) noexcept
      : cl_(other.cl_), event_(std::exchange(other.event_, nullptr)) {}
  EventGate& operator=(EventGate&&) = delete;
  ~EventGate() { Open(); }

  // For the wait list of the gated commands.
  const cl_event* event() const { return &event_; }
  void Open();

 private:
  EventGate(const OpenClLibrary* cl, cl_event event) : cl_(cl), event_(event) {}
  const OpenClLibrary* cl_;
  cl_event event_;
};

// ---------------------------------------------------------------------------------------------
// Staging.

// The staging ring of one device (src/device/staging_ring.h) with pinned chunks: each made by
// clCreateBuffer with CL_MEM_ALLOC_HOST_PTR and mapped once for the ring's life. `queue` must
// outlive the ring (the client destroys its rings first).
std::unique_ptr<StagingRing> MakeStagingRing(const DeviceQueue& queue);

// Writes the elements of `src` into `memory` (dense, `device_dtype`) through `ring` (the shared
// StagedWrite, each chunk enqueued with clEnqueueWriteBuffer): each chunk's event callback
// returns the chunk and completes its piece of `counter`. Returns once every chunk is enqueued
// (or the first error). Waits for free chunks: call it on the ring's worker or on a
// kImmutableOnlyDuringCall caller.
Status StagedWrite(StagingRing& ring, const HostView& src, DType device_dtype,
                   const DeviceMemory& memory, const std::shared_ptr<PieceCounter>& counter,
                   std::string_view what);

// Reads `memory` (dense, `device_dtype`, dims of `dst`) into `dst` through `ring` (the shared
// StagedRead, each chunk read with clEnqueueReadBuffer): each chunk's event callback converts
// it into `dst` and returns it. Same threading as StagedWrite.
Status StagedRead(StagingRing& ring, const DeviceMemory& memory, DType device_dtype,
                  const MutableHostView& dst, const std::shared_ptr<PieceCounter>& counter,
                  std::string_view what);

// An owned, 64-byte-aligned host block for small transfers (kInlineCopyBytes); freed on
// destruction, from any thread.
struct HostBlockDeleter {
  void operator()(std::byte* data) const;
};
using HostBlock = std::unique_ptr<std::byte, HostBlockDeleter>;
// ResourceExhausted when the allocation fails.
StatusOr<HostBlock> AllocateHostBlock(int64_t size_bytes, std::string_view what);

}  // namespace ferry::opencl
