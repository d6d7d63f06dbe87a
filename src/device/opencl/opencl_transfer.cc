#include "src/device/opencl/opencl_transfer.h"

#include <algorithm>
#include <cstdlib>

#include "ferry/core/metrics.h"
#include "ferry/core/runtime_thread.h"
#include "fmt/format.h"
#include "src/device/opencl/opencl_status.h"

namespace ferry::opencl {

TransferPath ChooseTransferPath(const HostView& view, DType device_dtype) {
  TransferPath path;
  // A conversion or byte-swapped elements need the copy-convert: staged.
  if (view.dtype != device_dtype || !view.IsNativeByteOrder()) return path;
  const int64_t element_size = view.element_size();
  // Collapse as the copy-convert plan does: drop size-1 dims, merge a dim into its inner
  // neighbour when the two step like one (the device side is dense, so it always agrees).
  struct Dim {
    int64_t size;
    int64_t stride;
  };
  absl::InlinedVector<Dim, 6> dims;
  for (size_t i = 0; i < view.dims.size(); ++i) {
    if (view.dims[i] == 1) continue;
    if (!dims.empty() && dims.back().stride == view.byte_strides[i] * view.dims[i]) {
      dims.back().size *= view.dims[i];
      dims.back().stride = view.byte_strides[i];
      continue;
    }
    dims.push_back({view.dims[i], view.byte_strides[i]});
  }
  if (dims.empty()) {
    path.kind = PathKind::kDense;
    return path;
  }
  if (dims.back().stride != element_size || dims.size() > 3) return path;
  for (const Dim& dim : dims) {
    if (dim.stride <= 0) return path;
  }
  if (dims.size() == 1) {
    path.kind = PathKind::kDense;
    return path;
  }
  // OpenCL wants rows that do not overlap (pitch >= row bytes) and, in 3-D, slices that hold
  // whole rows (slice pitch a multiple of the row pitch, at least rows x row pitch).
  const int64_t row_bytes = dims.back().size * element_size;
  const Dim& rows = dims[dims.size() - 2];
  if (rows.stride < row_bytes) return path;
  path.rect.region = {static_cast<size_t>(row_bytes), static_cast<size_t>(rows.size), 1};
  path.rect.host_row_pitch = static_cast<size_t>(rows.stride);
  path.rect.host_slice_pitch = static_cast<size_t>(rows.stride * rows.size);
  if (dims.size() == 3) {
    const Dim& slices = dims[0];
    if (slices.stride < rows.size * rows.stride || slices.stride % rows.stride != 0) return path;
    path.rect.region[2] = static_cast<size_t>(slices.size);
    path.rect.host_slice_pitch = static_cast<size_t>(slices.stride);
  }
  path.kind = PathKind::kRect;
  return path;
}

Status EventStatus(cl_int execution_status, std::string_view operation, std::string_view what) {
  if (execution_status == CL_COMPLETE) return OkStatus();
  return InternalError(fmt::format("the OpenCL {} for {} failed with {} ({})", operation, what,
                                   OpenClErrorName(execution_status), execution_status));
}

namespace {

struct EventCallback {
  const OpenClLibrary* cl;
  absl::AnyInvocable<void(cl_int) &&> on_complete;
};

void CL_CALLBACK RunEventCallback(cl_event event, cl_int execution_status, void* user_data) {
  RuntimeThreadScope runtime_thread;  // the OpenCL runtime's thread, running ferry's continuations
  std::unique_ptr<EventCallback> callback(static_cast<EventCallback*>(user_data));
  // clReleaseEvent is not a blocking call: allowed in a callback, and PoCL holds its own
  // reference until the callbacks have returned.
  callback->cl->clReleaseEvent(event);
  std::move(callback->on_complete)(execution_status);
}

}  // namespace

cl_int WaitForEvent(const OpenClLibrary& cl, cl_event event) {
  const cl_int waited = cl.clWaitForEvents(1, &event);
  cl_int execution_status = CL_COMPLETE;
  const cl_int queried = cl.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS,
                                           sizeof(execution_status), &execution_status, nullptr);
  cl.clReleaseEvent(event);
  if (queried != CL_SUCCESS) return queried;
  if (execution_status < 0) return execution_status;
  return waited;
}

void OnEventComplete(const OpenClLibrary& cl, cl_event event,
                     absl::AnyInvocable<void(cl_int) &&> on_complete, EventGate* gate) {
  auto callback = std::make_unique<EventCallback>(EventCallback{&cl, std::move(on_complete)});
  if (cl.clSetEventCallback(event, CL_COMPLETE, &RunEventCallback, callback.get()) == CL_SUCCESS) {
    callback.release();  // owned by the callback from here on (which may have run already)
    return;
  }
  if (gate != nullptr) gate->Open();  // or the wait below would never end
  const cl_int execution_status = WaitForEvent(cl, event);
  std::move(callback->on_complete)(execution_status);
}

StatusOr<EventGate> EventGate::Create(const DeviceQueue& queue, std::string_view what) {
  cl_int error = CL_SUCCESS;
  cl_event event = queue.cl().clCreateUserEvent(queue.context(), &error);
  FERRY_OPENCL_RETURN_IF_ERROR(error, "clCreateUserEvent", what);
  return EventGate(&queue.cl(), event);
}

void EventGate::Open() {
  if (event_ == nullptr) return;
  cl_->clSetUserEventStatus(event_, CL_COMPLETE);
  cl_->clReleaseEvent(event_);
  event_ = nullptr;
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<StagingRing> MakeStagingRing(const DeviceQueue& queue) {
  StagingChunkAllocator pinned;
  pinned.allocate = [&queue](int64_t bytes) -> StatusOr<StagingChunk> {
    const OpenClLibrary& cl = queue.cl();
    const std::string what = fmt::format("the staging ring of {}", queue.name());
    cl_int error = CL_SUCCESS;
    cl_mem buffer = cl.clCreateBuffer(queue.context(), CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                                      static_cast<size_t>(bytes), nullptr, &error);
    FERRY_OPENCL_RETURN_IF_ERROR(error, "clCreateBuffer", what);
    void* host = cl.clEnqueueMapBuffer(queue.queue(), buffer, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE,
                                       0, static_cast<size_t>(bytes), 0, nullptr, nullptr, &error);
    if (error != CL_SUCCESS) {
      cl.clReleaseMemObject(buffer);
      return FERRY_OPENCL_STATUS(error, "clEnqueueMapBuffer", what);
    }
    return StagingChunk{.host = static_cast<std::byte*>(host), .native = buffer};
  };
  // Runs in the ring's destructor, once no command uses the chunk: blocking calls are fine.
  pinned.free = [&queue](const StagingChunk& chunk, int64_t) {
    const OpenClLibrary& cl = queue.cl();
    auto* buffer = static_cast<cl_mem>(chunk.native);
    cl.clEnqueueUnmapMemObject(queue.queue(), buffer, chunk.host, 0, nullptr, nullptr);
    cl.clFinish(queue.queue());
    cl.clReleaseMemObject(buffer);
  };
  return std::make_unique<StagingRing>(fmt::format("the opencl client of {}", queue.name()),
                                       std::move(pinned));
}

Status StagedWrite(StagingRing& ring, const HostView& src, DType device_dtype,
                   const DeviceMemory& memory, const std::shared_ptr<PieceCounter>& counter,
                   std::string_view what) {
  const OpenClLibrary& cl = memory.queue().cl();
  const cl_command_queue queue = memory.queue().queue();
  return ferry::StagedWrite(
      ring, src, device_dtype,
      [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone done) -> Status {
        if (piece.size_bytes == 0) {
          std::move(done)(OkStatus());
          return OkStatus();
        }
        cl_event event = nullptr;
        const cl_int error = cl.clEnqueueWriteBuffer(
            queue, memory.mem(), CL_FALSE, static_cast<size_t>(piece.offset_bytes),
            static_cast<size_t>(piece.size_bytes), chunk.host, 0, nullptr, &event);
        FERRY_OPENCL_RETURN_IF_ERROR(error, "clEnqueueWriteBuffer (staged)", what);
        cl.clFlush(queue);
        OnEventComplete(cl, event,
                        [done = std::move(done), what = std::string(what)](cl_int status) mutable {
                          std::move(done)(EventStatus(status, "staged write", what));
                        });
        return OkStatus();
      },
      counter);
}

Status StagedRead(StagingRing& ring, const DeviceMemory& memory, DType device_dtype,
                  const MutableHostView& dst, const std::shared_ptr<PieceCounter>& counter,
                  std::string_view what) {
  const OpenClLibrary& cl = memory.queue().cl();
  const cl_command_queue queue = memory.queue().queue();
  return ferry::StagedRead(
      ring, device_dtype, dst,
      [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone landed) -> Status {
        cl_event event = nullptr;
        const cl_int error = cl.clEnqueueReadBuffer(
            queue, memory.mem(), CL_FALSE, static_cast<size_t>(piece.offset_bytes),
            static_cast<size_t>(piece.size_bytes), chunk.host, 0, nullptr, &event);
        FERRY_OPENCL_RETURN_IF_ERROR(error, "clEnqueueReadBuffer (staged)", what);
        cl.clFlush(queue);
        // The shared loop's `landed` converts the chunk into `dst`: CPU work that never waits,
        // fine in an event callback.
        OnEventComplete(
            cl, event,
            [landed = std::move(landed), what = std::string(what)](cl_int status) mutable {
              std::move(landed)(EventStatus(status, "staged read", what));
            });
        return OkStatus();
      },
      counter);
}

void HostBlockDeleter::operator()(std::byte* data) const { std::free(data); }

StatusOr<HostBlock> AllocateHostBlock(int64_t size_bytes, std::string_view what) {
  const size_t rounded = (static_cast<size_t>(std::max<int64_t>(size_bytes, 1)) + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, rounded);
  if (data == nullptr) {
    return ResourceExhaustedError(
        fmt::format("could not allocate {} bytes of host memory for {}", size_bytes, what));
  }
  return HostBlock(static_cast<std::byte*>(data));
}

}  // namespace ferry::opencl
