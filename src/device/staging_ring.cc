#include "src/device/staging_ring.h"

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <utility>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/runtime_thread.h"
#include "fmt/format.h"

namespace ferry {

StagingChunkAllocator StagingChunkAllocator::Host() {
  StagingChunkAllocator allocator;
  allocator.allocate = [](int64_t bytes) -> StatusOr<StagingChunk> {
    std::byte* host = AllocateHostMemory(bytes);
    if (host == nullptr) {
      return ResourceExhaustedError(
          fmt::format("could not allocate a staging chunk of {} bytes of host memory", bytes));
    }
    return StagingChunk{.host = host};
  };
  allocator.free = [](const StagingChunk& chunk, int64_t bytes) {
    FreeHostMemory(chunk.host, bytes);
  };
  return allocator;
}

StagingRing::StagingRing(std::string owner, StagingChunkAllocator allocator, int num_chunks,
                         int64_t chunk_bytes)
    : owner_(std::move(owner)),
      allocator_(std::move(allocator)),
      num_chunks_(std::max(num_chunks, 1)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 4096)) {}

StagingRing::~StagingRing() {
  Shutdown();
  MutexLock lock(chunks_mutex_);
  for (const std::unique_ptr<StagingChunk>& chunk : chunks_) allocator_.free(*chunk, chunk_bytes_);
}

Status StagingRing::AllocateChunksLocked() {
  std::vector<std::unique_ptr<StagingChunk>> chunks;
  for (int i = 0; i < num_chunks_; ++i) {
    StatusOr<StagingChunk> chunk = allocator_.allocate(chunk_bytes_);
    if (!chunk.ok()) {
      for (const std::unique_ptr<StagingChunk>& made : chunks) allocator_.free(*made, chunk_bytes_);
      return Status(chunk.status().code(), fmt::format("the staging ring of {}: {}", owner_,
                                                       std::string(chunk.status().message())));
    }
    chunks.push_back(std::make_unique<StagingChunk>(*chunk));
  }
  chunks_ = std::move(chunks);
  for (const std::unique_ptr<StagingChunk>& chunk : chunks_) free_chunks_.push_back(chunk.get());
  return OkStatus();
}

StatusOr<StagingChunk*> StagingRing::Acquire() {
  MutexLock lock(chunks_mutex_);
  // No chunk is in flight before they exist, so no callback waits for this lock meanwhile.
  if (chunks_.empty()) FERRY_RETURN_IF_ERROR(AllocateChunksLocked());
  while (free_chunks_.empty()) lock.Wait(chunk_free_);
  StagingChunk* chunk = free_chunks_.back();
  free_chunks_.pop_back();
  return chunk;
}

void StagingRing::Release(StagingChunk* chunk) {
  {
    MutexLock lock(chunks_mutex_);
    free_chunks_.push_back(chunk);
  }
  chunk_free_.notify_one();
}

Status StagingRing::Submit(Job job) {
  {
    MutexLock lock(jobs_mutex_);
    if (stopping_) return FailedPreconditionError(fmt::format("{} has shut down", owner_));
    if (!worker_.joinable()) {
      // Started before the job is queued: a worker that cannot start leaves nothing queued.
      try {
        worker_ = std::thread([this] { WorkerLoop(); });
      } catch (const std::system_error& error) {
        return ResourceExhaustedError(
            fmt::format("{} could not start its staging thread: {}", owner_, error.what()));
      }
    }
    jobs_.push_back(std::move(job));
  }
  job_available_.notify_one();
  return OkStatus();
}

void StagingRing::WorkerLoop() {
  RuntimeThreadScope runtime_thread;
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

void StagingRing::Execute(absl::AnyInvocable<void() &&> task) {
  // Shared so that a refused job (after Shutdown) leaves the task here to run.
  auto shared = std::make_shared<absl::AnyInvocable<void() &&>>(std::move(task));
  if (!Submit([shared](Status) { std::move (*shared)(); }).ok()) std::move (*shared)();
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
    std::move(job)(CancelledError(fmt::format("{} shut down before the transfer started", owner_)));
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
  row_elements = std::max<int64_t>(1, row_elements);
  if (row_elements <= chunk_elements) chunk_elements -= chunk_elements % row_elements;
  return chunk_elements;
}

// The address a dense tensor of `element_size` elements would start at for its element `begin`
// to sit on the chunk's first byte. Only elements from `begin` on are ever accessed through it
// (computed on integers: the start itself lies before the chunk).
std::byte* ChunkBase(const StagingChunk& chunk, int64_t begin, int64_t element_size) {
  return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(chunk.host) -
                                      static_cast<uintptr_t>(begin * element_size));
}

}  // namespace

Status StagedWrite(StagingRing& ring, const HostView& src, DType device_dtype, ChunkWriter write,
                   const std::shared_ptr<PieceCounter>& counter) {
  const int64_t element_size = DTypeSize(device_dtype);
  const int64_t num_elements = src.num_elements();
  FERRY_ASSIGN_OR_RETURN(
      const CopyConvertPlan shape,
      CopyConvertPlan::Create(src, MutableHostView::Dense(nullptr, device_dtype, src.dims)));
  const int64_t chunk_elements = ChunkElements(ring, device_dtype, shape.row_elements());
  int64_t begin = 0;
  do {
    const int64_t end = std::min(num_elements, begin + chunk_elements);
    FERRY_ASSIGN_OR_RETURN(StagingChunk * chunk, ring.Acquire());
    if (end > begin) {
      StatusOr<CopyConvertPlan> plan = CopyConvertPlan::Create(
          src,
          MutableHostView::Dense(ChunkBase(*chunk, begin, element_size), device_dtype, src.dims));
      if (!plan.ok()) {
        ring.Release(chunk);
        return plan.status();
      }
      plan->CopyElements(begin, end);
      metrics::StagingBytes()->Add((end - begin) * element_size);
    }
    const StagedPiece piece{.offset_bytes = begin * element_size,
                            .size_bytes = (end - begin) * element_size,
                            .last = end == num_elements};
    counter->Add();
    Status started = write(*chunk, piece, [ring = &ring, chunk, counter](Status status) {
      ring->Release(chunk);
      counter->Done(std::move(status));
    });
    if (!started.ok()) {
      ring.Release(chunk);
      counter->Done(OkStatus());  // the piece never started; the error is returned instead
      return started;
    }
    begin = end;
  } while (begin < num_elements);
  return OkStatus();
}

Status StagedRead(StagingRing& ring, DType device_dtype, const MutableHostView& dst,
                  ChunkReader read, const std::shared_ptr<PieceCounter>& counter) {
  const int64_t element_size = DTypeSize(device_dtype);
  const int64_t num_elements = dst.num_elements();
  FERRY_ASSIGN_OR_RETURN(
      const CopyConvertPlan shape,
      CopyConvertPlan::Create(HostView::Dense(nullptr, device_dtype, dst.dims), dst));
  const int64_t chunk_elements = ChunkElements(ring, device_dtype, shape.row_elements());
  for (int64_t begin = 0; begin < num_elements;) {
    const int64_t end = std::min(num_elements, begin + chunk_elements);
    FERRY_ASSIGN_OR_RETURN(StagingChunk * chunk, ring.Acquire());
    const StagedPiece piece{.offset_bytes = begin * element_size,
                            .size_bytes = (end - begin) * element_size,
                            .last = end == num_elements};
    counter->Add();
    // The conversion out of the chunk runs where the bytes land: CPU work that never waits.
    Status started = read(
        *chunk, piece,
        [ring = &ring, chunk, counter, dst, device_dtype, begin, end, element_size](Status status) {
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
    if (!started.ok()) {
      ring.Release(chunk);
      counter->Done(OkStatus());
      return started;
    }
    begin = end;
  }
  return OkStatus();
}

}  // namespace ferry
