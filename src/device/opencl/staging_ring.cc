#include "src/device/opencl/staging_ring.h"

#include <algorithm>
#include <cstdlib>

#include "ferry/core/metrics.h"
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

StagingRing::StagingRing(const DeviceQueue& queue, int num_chunks, int64_t chunk_bytes)
    : queue_(queue),
      num_chunks_(std::max(num_chunks, 1)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 4096)) {}

StagingRing::~StagingRing() {
  Shutdown();
  const OpenClLibrary& cl = queue_.cl();
  if (chunks_.empty()) return;
  for (const Chunk& chunk : chunks_) {
    cl.clEnqueueUnmapMemObject(queue_.queue(), chunk.buffer, chunk.host, 0, nullptr, nullptr);
  }
  cl.clFinish(queue_.queue());
  for (const Chunk& chunk : chunks_) cl.clReleaseMemObject(chunk.buffer);
}

Status StagingRing::CreateChunksLocked() {
  const OpenClLibrary& cl = queue_.cl();
  const std::string what = fmt::format("the staging ring of {}", queue_.name());
  std::vector<Chunk> chunks;
  Status status;
  for (int i = 0; i < num_chunks_ && status.ok(); ++i) {
    cl_int error = CL_SUCCESS;
    Chunk chunk;
    chunk.buffer = cl.clCreateBuffer(queue_.context(), CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                                     static_cast<size_t>(chunk_bytes_), nullptr, &error);
    if (error != CL_SUCCESS) {
      status = FERRY_OPENCL_STATUS(error, "clCreateBuffer", what);
      break;
    }
    void* host =
        cl.clEnqueueMapBuffer(queue_.queue(), chunk.buffer, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                              static_cast<size_t>(chunk_bytes_), 0, nullptr, nullptr, &error);
    if (error != CL_SUCCESS) {
      cl.clReleaseMemObject(chunk.buffer);
      status = FERRY_OPENCL_STATUS(error, "clEnqueueMapBuffer", what);
      break;
    }
    chunk.host = static_cast<std::byte*>(host);
    chunks.push_back(chunk);
  }
  if (!status.ok()) {
    for (const Chunk& chunk : chunks) {
      cl.clEnqueueUnmapMemObject(queue_.queue(), chunk.buffer, chunk.host, 0, nullptr, nullptr);
    }
    cl.clFinish(queue_.queue());
    for (const Chunk& chunk : chunks) cl.clReleaseMemObject(chunk.buffer);
    return status;
  }
  chunks_ = std::move(chunks);
  for (Chunk& chunk : chunks_) free_chunks_.push_back(&chunk);
  return OkStatus();
}

StatusOr<StagingRing::Chunk*> StagingRing::Acquire() {
  MutexLock lock(chunks_mutex_);
  // No chunk is in flight before they exist, so no callback waits for this lock meanwhile.
  if (chunks_.empty()) FERRY_RETURN_IF_ERROR(CreateChunksLocked());
  while (free_chunks_.empty()) lock.Wait(chunk_free_);
  Chunk* chunk = free_chunks_.back();
  free_chunks_.pop_back();
  return chunk;
}

void StagingRing::Release(Chunk* chunk) {
  {
    MutexLock lock(chunks_mutex_);
    free_chunks_.push_back(chunk);
  }
  chunk_free_.notify_one();
}

Status StagingRing::Submit(Job job) {
  {
    MutexLock lock(jobs_mutex_);
    if (stopping_) {
      return FailedPreconditionError(
          fmt::format("the opencl client of {} has shut down", queue_.name()));
    }
    jobs_.push_back(std::move(job));
    if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  }
  job_available_.notify_one();
  return OkStatus();
}

void StagingRing::WorkerLoop() {
  MutexLock lock(jobs_mutex_);
  while (true) {
    while (!stopping_ && jobs_.empty()) lock.Wait(job_available_);
    if (jobs_.empty()) return;  // stopping; Shutdown took the queued jobs
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.Unlock();
    std::move(job)(OkStatus());
    job = nullptr;  // its captures go before the lock is taken again
    lock.Lock();
  }
}

void StagingRing::Shutdown() {
  std::deque<Job> cancelled;
  std::thread worker;
  {
    MutexLock lock(jobs_mutex_);
    stopping_ = true;
    cancelled.swap(jobs_);
    worker = std::move(worker_);  // no Submit starts another once stopping_ is set
  }
  job_available_.notify_all();
  for (Job& job : cancelled) {
    std::move(job)(CancelledError("the opencl client shut down before the transfer started"));
    job = nullptr;
  }
  if (worker.joinable()) worker.join();
}

// ---------------------------------------------------------------------------------------------

namespace {

// Elements per chunk: as many as fit in one chunk in the device dtype, whole rows where a row
// fits.
int64_t ChunkElements(const StagingRing& ring, DType device_dtype, int64_t row_elements) {
  int64_t chunk_elements = std::max<int64_t>(1, ring.chunk_bytes() / DTypeSize(device_dtype));
  if (row_elements <= chunk_elements) chunk_elements -= chunk_elements % row_elements;
  return chunk_elements;
}

// The address a dense tensor of `element_size` elements would start at for its element `begin`
// to sit on `chunk`'s first byte. Only elements from `begin` on are ever accessed through it
// (computed on integers: the start itself lies before the chunk).
std::byte* ChunkBase(const StagingRing::Chunk& chunk, int64_t begin, int64_t element_size) {
  return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(chunk.host) -
                                      static_cast<uintptr_t>(begin * element_size));
}

}  // namespace

Status StagedWrite(StagingRing& ring, const HostView& src, DType device_dtype,
                   const DeviceMemory& memory, const std::shared_ptr<PieceCounter>& counter,
                   std::string_view what) {
  const OpenClLibrary& cl = memory.queue().cl();
  const cl_command_queue queue = memory.queue().queue();
  const int64_t element_size = DTypeSize(device_dtype);
  const int64_t num_elements = src.num_elements();
  FERRY_ASSIGN_OR_RETURN(
      const CopyConvertPlan shape,
      CopyConvertPlan::Create(src, MutableHostView::Dense(nullptr, device_dtype, src.dims)));
  const int64_t chunk_elements = ChunkElements(ring, device_dtype, shape.row_elements());
  for (int64_t begin = 0; begin < num_elements;) {
    const int64_t end = std::min(num_elements, begin + chunk_elements);
    FERRY_ASSIGN_OR_RETURN(StagingRing::Chunk * chunk, ring.Acquire());
    StatusOr<CopyConvertPlan> plan = CopyConvertPlan::Create(
        src,
        MutableHostView::Dense(ChunkBase(*chunk, begin, element_size), device_dtype, src.dims));
    if (!plan.ok()) {
      ring.Release(chunk);
      return plan.status();
    }
    plan->CopyElements(begin, end);
    const int64_t bytes = (end - begin) * element_size;
    metrics::StagingBytes()->Add(bytes);
    cl_event event = nullptr;
    const cl_int error = cl.clEnqueueWriteBuffer(
        queue, memory.mem(), CL_FALSE, static_cast<size_t>(begin * element_size),
        static_cast<size_t>(bytes), chunk->host, 0, nullptr, &event);
    if (error != CL_SUCCESS) {
      ring.Release(chunk);
      return FERRY_OPENCL_STATUS(error, "clEnqueueWriteBuffer (staged)", what);
    }
    cl.clFlush(queue);
    counter->Add();
    OnEventComplete(cl, event,
                    [ring = &ring, chunk, counter, what = std::string(what)](cl_int status) {
                      ring->Release(chunk);
                      counter->Done(EventStatus(status, "staged write", what));
                    });
    begin = end;
  }
  return OkStatus();
}

Status StagedRead(StagingRing& ring, const DeviceMemory& memory, DType device_dtype,
                  const MutableHostView& dst, const std::shared_ptr<PieceCounter>& counter,
                  std::string_view what) {
  const OpenClLibrary& cl = memory.queue().cl();
  const cl_command_queue queue = memory.queue().queue();
  const int64_t element_size = DTypeSize(device_dtype);
  const int64_t num_elements = dst.num_elements();
  FERRY_ASSIGN_OR_RETURN(
      const CopyConvertPlan shape,
      CopyConvertPlan::Create(HostView::Dense(nullptr, device_dtype, dst.dims), dst));
  const int64_t chunk_elements = ChunkElements(ring, device_dtype, shape.row_elements());
  for (int64_t begin = 0; begin < num_elements;) {
    const int64_t end = std::min(num_elements, begin + chunk_elements);
    FERRY_ASSIGN_OR_RETURN(StagingRing::Chunk * chunk, ring.Acquire());
    const int64_t bytes = (end - begin) * element_size;
    cl_event event = nullptr;
    const cl_int error = cl.clEnqueueReadBuffer(
        queue, memory.mem(), CL_FALSE, static_cast<size_t>(begin * element_size),
        static_cast<size_t>(bytes), chunk->host, 0, nullptr, &event);
    if (error != CL_SUCCESS) {
      ring.Release(chunk);
      return FERRY_OPENCL_STATUS(error, "clEnqueueReadBuffer (staged)", what);
    }
    cl.clFlush(queue);
    counter->Add();
    // The conversion out of the chunk runs in the callback: CPU work that never waits.
    OnEventComplete(
        cl, event,
        [ring = &ring, chunk, counter, dst, device_dtype, begin, end, element_size,
         what = std::string(what)](cl_int execution_status) {
          Status status = EventStatus(execution_status, "staged read", what);
          if (status.ok()) {
            StatusOr<CopyConvertPlan> plan = CopyConvertPlan::Create(
                HostView::Dense(ChunkBase(*chunk, begin, element_size), device_dtype, dst.dims),
                dst);
            if (plan.ok()) {
              plan->CopyElements(begin, end);
              metrics::StagingBytes()->Add((end - begin) * element_size);
            } else {
              status = plan.status();
            }
          }
          ring->Release(chunk);
          counter->Done(std::move(status));
        });
    begin = end;
  }
  return OkStatus();
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
