#include "src/device/opencl/opencl_buffer.h"

#include <algorithm>

#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/device/opencl/opencl_client.h"
#include "src/device/opencl/opencl_status.h"
#include "src/device/opencl/opencl_transfer.h"

namespace ferry::opencl {

StatusOr<std::shared_ptr<DeviceQueue>> DeviceQueue::Create(const OpenClLibrary& cl,
                                                           cl_device_id device, bool opencl_1x,
                                                           std::string name,
                                                           int64_t cache_limit_bytes) {
  cl_platform_id platform = nullptr;
  FERRY_OPENCL_RETURN_IF_ERROR(
      cl.clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof(platform), &platform, nullptr),
      "clGetDeviceInfo(CL_DEVICE_PLATFORM)", name);
  const cl_context_properties properties[] = {CL_CONTEXT_PLATFORM,
                                              reinterpret_cast<cl_context_properties>(platform), 0};
  cl_int error = CL_SUCCESS;
  cl_context context = cl.clCreateContext(properties, 1, &device, nullptr, nullptr, &error);
  FERRY_OPENCL_RETURN_IF_ERROR(error, "clCreateContext", name);
  cl_command_queue queue = nullptr;
  if (!opencl_1x && cl.clCreateCommandQueueWithProperties != nullptr) {
    queue = cl.clCreateCommandQueueWithProperties(context, device, nullptr, &error);
  } else if (cl.clCreateCommandQueue != nullptr) {
    queue = cl.clCreateCommandQueue(context, device, 0, &error);
  } else {
    error = CL_INVALID_OPERATION;
  }
  if (error != CL_SUCCESS) {
    cl.clReleaseContext(context);
    return FERRY_OPENCL_STATUS(error, "clCreateCommandQueue", name);
  }
  return std::shared_ptr<DeviceQueue>(
      new DeviceQueue(cl, device, context, queue, std::move(name), cache_limit_bytes));
}

DeviceQueue::~DeviceQueue() {
  cache_.ReleaseAll();
  cl_.clReleaseCommandQueue(queue_);
  cl_.clReleaseContext(context_);
}

StatusOr<cl_mem> DeviceQueue::AllocateMemory(int64_t size_bytes, std::string_view tensor_name) {
  if (std::optional<cl_mem> cached = cache_.Take(size_bytes)) return *cached;
  cl_int error = CL_SUCCESS;
  cl_mem mem = cl_.clCreateBuffer(context_, CL_MEM_READ_WRITE, static_cast<size_t>(size_bytes),
                                  nullptr, &error);
  // Out of memory (the errors OpenClErrorStatusCode maps to ResourceExhausted): the cached
  // buffers may be what is missing.
  if (OpenClErrorStatusCode(error) == absl::StatusCode::kResourceExhausted && cache_.ReleaseAll()) {
    mem = cl_.clCreateBuffer(context_, CL_MEM_READ_WRITE, static_cast<size_t>(size_bytes), nullptr,
                             &error);
  }
  if (error != CL_SUCCESS) {
    return FERRY_OPENCL_STATUS(
        error, "clCreateBuffer",
        fmt::format("tensor '{}' ({} bytes) on {}", tensor_name, size_bytes, name_));
  }
  return mem;
}

StatusOr<std::shared_ptr<DeviceMemory>> DeviceMemory::Create(std::shared_ptr<DeviceQueue> queue,
                                                             std::shared_ptr<MemoryAccount> account,
                                                             int64_t size_bytes,
                                                             std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(account->Reserve(size_bytes, tensor_name, queue->name()));
  cl_mem mem = nullptr;
  if (size_bytes > 0) {
    StatusOr<cl_mem> allocated = queue->AllocateMemory(size_bytes, tensor_name);
    if (!allocated.ok()) {
      account->Release(size_bytes);
      return allocated.status();
    }
    mem = *allocated;
  }
  return std::shared_ptr<DeviceMemory>(
      new DeviceMemory(std::move(queue), std::move(account), mem, size_bytes));
}

DeviceMemory::~DeviceMemory() {
  if (mem_ != nullptr) queue_->FreeMemory(mem_, size_bytes_);
  account_->Release(size_bytes_);
}

// ---------------------------------------------------------------------------------------------

OpenClBuffer::OpenClBuffer(OpenClDevice* device, DType device_dtype, Dims dims,
                           std::shared_ptr<DeviceMemory> memory, Future<> ready, Future<> enqueued,
                           std::shared_ptr<ClientLifetime> lifetime, StagingRing* ring,
                           std::string tensor_name)
    : device_(device),
      device_dtype_(device_dtype),
      dims_(std::move(dims)),
      memory_(std::move(memory)),
      ready_(std::move(ready)),
      enqueued_(std::move(enqueued)),
      lifetime_(std::move(lifetime)),
      ring_(ring),
      tensor_name_(std::move(tensor_name)) {}

Device* OpenClBuffer::device() const { return device_; }

StatusOr<NativeBufferHandle> OpenClBuffer::NativeHandle() const {
  if (lifetime_->closed()) {
    return FailedPreconditionError(fmt::format(
        "NativeHandle of tensor '{}': its opencl client has been shut down", tensor_name_));
  }
  return NativeBufferHandle{memory_->mem()};
}

StatusOr<BufferAddress> OpenClBuffer::DataAddress() const {
  return UnimplementedError(fmt::format(
      "DataAddress of tensor '{}': OpenCL memory has no address (NativeHandle() gives its cl_mem)",
      tensor_name_));
}

namespace {

// One ToHost, from the moment the buffer's writes are enqueued.
struct ReadRequest {
  ClientLifetime::Token token;
  std::shared_ptr<DeviceMemory> memory;
  Future<> ready;
  StagingRing* ring;
  DType device_dtype;
  MutableHostView dst;
  TransferPath path;
  Promise<> done;
  std::string what;
};

// Enqueues the read. `done` completes after the last piece, with the read's error or else with
// the buffer's Ready() status (the data is only valid once the writes have succeeded).
void StartRead(ReadRequest request) {
  const DeviceQueue& queue = request.memory->queue();
  const OpenClLibrary& cl = queue.cl();
  // The read holds the buffer's memory only while it enqueues (the in-order queue runs a later
  // owner's commands after it) and lets go of it before its last piece reports: whoever destroys
  // the buffer once the read's future completes finds its bytes out of bytes_in_use at once.
  auto counter = std::make_shared<PieceCounter>(
      [done = request.done, ready = request.ready](Status status) {
        if (!status.ok()) {
          done.Set(std::move(status));
          return;
        }
        ready.OnReady([done](const Status& ready_status) { done.Set(ready_status); });
      },
      std::move(request.token));
  auto complete_piece = [counter, what = request.what](cl_int execution_status) {
    counter->Done(EventStatus(execution_status, "read", what));
  };
  const int64_t device_bytes = request.memory->size_bytes();
  cl_event event = nullptr;
  Status started;
  switch (request.path.kind) {
    case PathKind::kDense: {
      const cl_int error = cl.clEnqueueReadBuffer(queue.queue(), request.memory->mem(), CL_FALSE, 0,
                                                  static_cast<size_t>(device_bytes),
                                                  request.dst.data, 0, nullptr, &event);
      started = FERRY_OPENCL_STATUS(error, "clEnqueueReadBuffer", request.what);
      if (started.ok()) {
        counter->Add();
        OnEventComplete(cl, event, std::move(complete_piece));
      }
      break;
    }
    case PathKind::kRect: {
      const RectLayout& rect = request.path.rect;
      const size_t origin[3] = {0, 0, 0};
      const cl_int error = cl.clEnqueueReadBufferRect(
          queue.queue(), request.memory->mem(), CL_FALSE, origin, origin, rect.region.data(),
          rect.region[0], rect.region[0] * rect.region[1], rect.host_row_pitch,
          rect.host_slice_pitch, request.dst.data, 0, nullptr, &event);
      started = FERRY_OPENCL_STATUS(error, "clEnqueueReadBufferRect", request.what);
      if (started.ok()) {
        counter->Add();
        OnEventComplete(cl, event, std::move(complete_piece));
      }
      break;
    }
    case PathKind::kStaged: {
      const int64_t dst_bytes = request.dst.dense_size_bytes();
      if (std::max(device_bytes, dst_bytes) <= kInlineCopyBytes) {
        // Small: read into a block of our own and convert out of it in the callback.
        StatusOr<HostBlock> block = AllocateHostBlock(device_bytes, request.what);
        started = block.status();
        if (!started.ok()) break;
        const cl_int error = cl.clEnqueueReadBuffer(queue.queue(), request.memory->mem(), CL_FALSE,
                                                    0, static_cast<size_t>(device_bytes),
                                                    block->get(), 0, nullptr, &event);
        started = FERRY_OPENCL_STATUS(error, "clEnqueueReadBuffer", request.what);
        if (!started.ok()) break;
        counter->Add();
        OnEventComplete(cl, event,
                        [counter, block = *std::move(block), dst = request.dst,
                         device_dtype = request.device_dtype, device_bytes,
                         what = request.what](cl_int execution_status) mutable {
                          Status status = EventStatus(execution_status, "read", what);
                          if (status.ok()) {
                            status = CopyConvert(
                                HostView::Dense(block.get(), device_dtype, dst.dims), dst);
                            metrics::StagingBytes()->Add(device_bytes);
                          }
                          block.reset();
                          counter->Done(std::move(status));
                        });
        break;
      }
      // Large: the ring's worker waits for chunks, not this thread.
      counter->Add();  // the job's hold
      started = request.ring->Submit([counter, memory = request.memory, ring = request.ring,
                                      device_dtype = request.device_dtype, dst = request.dst,
                                      what = request.what](Status status) mutable {
        if (status.ok()) status = StagedRead(*ring, *memory, device_dtype, dst, counter, what);
        memory.reset();
        counter->Done(std::move(status));
      });
      if (!started.ok()) counter->Done(started);  // the job was dropped: release its hold
      break;
    }
  }
  if (started.ok()) cl.clFlush(queue.queue());
  request.memory.reset();
  counter->Done(std::move(started));  // the starter's hold
}

// One CopyRawToHost, from the moment the buffer's writes are enqueued.
struct RawReadRequest {
  ClientLifetime::Token token;
  std::shared_ptr<DeviceMemory> memory;
  Future<> ready;
  int64_t offset_bytes = 0;
  int64_t size_bytes = 0;
  void* dst = nullptr;
  Promise<> done;
  std::string what;
};

// Enqueues the partial read without waiting for it. `done` completes once it has run, with its
// error or else with the buffer's Ready() status (the bytes are only valid once the writes have
// succeeded). Like StartRead, it holds the memory only while it enqueues.
void StartRawRead(RawReadRequest request) {
  if (request.size_bytes == 0) {
    request.ready.OnReady([done = request.done](const Status& ready) { done.Set(ready); });
    return;
  }
  const DeviceQueue& queue = request.memory->queue();
  const OpenClLibrary& cl = queue.cl();
  cl_event event = nullptr;
  const cl_int error = cl.clEnqueueReadBuffer(
      queue.queue(), request.memory->mem(), CL_FALSE, static_cast<size_t>(request.offset_bytes),
      static_cast<size_t>(request.size_bytes), request.dst, 0, nullptr, &event);
  if (Status started = FERRY_OPENCL_STATUS(error, "clEnqueueReadBuffer (partial)", request.what);
      !started.ok()) {
    request.done.Set(std::move(started));
    return;
  }
  request.memory.reset();
  OnEventComplete(
      cl, event,
      [done = request.done, ready = request.ready, token = std::move(request.token),
       what = std::move(request.what)](cl_int execution_status) mutable {
        Status status = EventStatus(execution_status, "partial read", what);
        if (!status.ok()) {
          done.Set(std::move(status));
          return;  // the token goes after the caller's continuations, as ToHost's
        }
        // The writes ran before the read: report their status, if they failed. The
        // token is released once the continuations of `done` have returned, so the
        // client's destructor waits for them (docs/opencl.md: never a context's
        // last reference dropped on a callback thread).
        ready.OnReady([done, token = std::move(token)](const Status& ready_status) mutable {
          done.Set(ready_status);
          token.Release();
        });
      });
  cl.clFlush(queue.queue());
}

// Runs `start(request)` once `enqueued` (every write of the buffer enqueued) completes: reads go
// into the in-order queue after the writes. The continuation runs on this thread when the writes
// are enqueued already, else on the staging worker once it has enqueued them; a failure to
// enqueue them completes request.done with that error instead.
//
// The read holds the client (its lifetime token) only from then on: while it waits for writes
// that a BufferWriter has yet to make, the client may be destroyed (before: its destructor waited
// for this token, and the writer that would have ended the wait was destroyed after the client:
// a hang). A read whose writes are enqueued after the client closed fails with
// FailedPrecondition; one whose writer is abandoned fails with that writer's Aborted.
template <typename Request>
void StartOnceWritesEnqueued(const Future<>& enqueued, std::shared_ptr<ClientLifetime> lifetime,
                             Request request, void (*start)(Request)) {
  enqueued.OnReady([lifetime = std::move(lifetime), request = std::move(request),
                    start](const Status& status) mutable {
    if (!status.ok()) {
      request.done.Set(status);
      return;
    }
    StatusOr<ClientLifetime::Token> token = ClientLifetime::Begin(lifetime, request.what);
    if (!token.ok()) {
      request.done.Set(token.status());
      return;
    }
    request.token = *std::move(token);
    start(std::move(request));
  });
}

}  // namespace

Future<> OpenClBuffer::CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) {
  if (Status valid = CheckRawRange(this->size_bytes(), offset_bytes, size_bytes, dst);
      !valid.ok()) {
    return Future<>::Ready(valid);
  }
  // Refused at once on a closed client; the token itself is taken once the writes are enqueued.
  if (Status open = ClientLifetime::Begin(lifetime_, "CopyRawToHost").status(); !open.ok()) {
    return Future<>::Ready(open);
  }
  Promise<> done;
  RawReadRequest request{
      ClientLifetime::Token(),
      memory_,
      ready_,
      offset_bytes,
      size_bytes,
      dst,
      done,
      fmt::format("reading bytes [{}, {}) of tensor '{}' from {}", offset_bytes,
                  offset_bytes + size_bytes, tensor_name_, memory_->queue().name())};
  StartOnceWritesEnqueued(enqueued_, lifetime_, std::move(request), &StartRawRead);
  return done.future();
}

Future<> OpenClBuffer::ToHost(const MutableHostView& dst) {
  if (Status valid = CheckToHostArgs(dims_, device_dtype_, dst); !valid.ok()) {
    return Future<>::Ready(valid);
  }
  const std::string what =
      fmt::format("reading tensor '{}' from {}", tensor_name_, memory_->queue().name());
  // Refused at once on a closed client; the token itself is taken once the writes are enqueued.
  if (Status open = ClientLifetime::Begin(lifetime_, "ToHost").status(); !open.ok()) {
    return Future<>::Ready(open);
  }

  Promise<> done;
  if (dst.num_elements() == 0) {
    ready_.OnReady([done](const Status& ready) { done.Set(ready); });
    return done.future();
  }
  ReadRequest request{ClientLifetime::Token(),
                      memory_,
                      ready_,
                      ring_,
                      device_dtype_,
                      dst,
                      ChooseTransferPath(dst, device_dtype_),
                      done,
                      what};
  StartOnceWritesEnqueued(enqueued_, lifetime_, std::move(request), &StartRead);
  return done.future();
}

}  // namespace ferry::opencl
