// The staging ring every backend that cannot take a caller's view directly streams through: a
// fixed set of host chunks, a worker thread for the staged work of asynchronous calls, and the
// two loops that move a tensor through the chunks with ferry's fused copy-convert.
//
// A converting or re-striding transfer never needs a full-size temporary: StagedWrite fills one
// chunk at a time with the elements of the source, converted to the device dtype, and hands each
// filled chunk to the backend (OpenCL: clEnqueueWriteBuffer from pinned memory; PJRT: the
// transfer manager's TransferData), which returns the chunk once the device has taken its bytes.
// StagedRead runs the other way: the backend reads device bytes into a chunk, and the ring
// converts them into any strided host destination. At most `num_chunks` x `chunk_bytes` of
// staging memory exist per ring, whatever the tensor size.
//
// Threads. Acquire() may wait for a free chunk: call the loops on a ring's worker job or on a
// caller that may block (kImmutableOnlyDuringCall). The backend's callbacks (`done`, `landed`)
// may run on any thread, the runtime's own included; they never wait: they return the chunk,
// convert a read chunk into its destination and complete the operation's PieceCounter.
// Ownership: the ring owns its chunks and its worker; a backend destroys a ring only once no
// command uses a chunk (after its queue has drained).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "ferry/core/dtype.h"
#include "ferry/core/future.h"
#include "ferry/core/host_view.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"
#include "src/device/piece_counter.h"

namespace ferry {

// One chunk of staging memory: `host` is where ferry's kernels read and write (64-byte aligned,
// valid for the ring's life); `native` is the backend's own handle for it, if any (OpenCL: the
// pinned cl_mem the host pointer maps).
struct StagingChunk {
  std::byte* host = nullptr;
  void* native = nullptr;
};

// How a backend makes and frees its chunks. `allocate(bytes)` runs on first use of the ring;
// `free(chunk, bytes)` runs in the ring's destructor, once per chunk made.
struct StagingChunkAllocator {
  absl::AnyInvocable<StatusOr<StagingChunk>(int64_t bytes)> allocate;
  absl::AnyInvocable<void(const StagingChunk&, int64_t bytes)> free;

  // Pageable host memory from ferry's allocator (backends whose runtime copies from any host
  // memory, like PJRT's TransferData).
  static StagingChunkAllocator Host();
};

// Also an Executor (ferry/core/future.h): Execute runs a task as a job of the worker, or on the
// calling thread once the ring has shut down.
class StagingRing final : public Executor {
 public:
  static constexpr int kDefaultChunks = 4;
  static constexpr int64_t kDefaultChunkBytes = int64_t{8} << 20;

  // `owner` names the client or device in errors ("opencl:0", "the pjrt client").
  StagingRing(std::string owner, StagingChunkAllocator allocator, int num_chunks = kDefaultChunks,
              int64_t chunk_bytes = kDefaultChunkBytes);
  // Shutdown(), then frees the chunks: only once no chunk is in use, never from a callback or
  // the worker.
  ~StagingRing() override;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  int num_chunks() const { return num_chunks_; }
  int64_t chunk_bytes() const { return chunk_bytes_; }

  // Waits until a chunk is free and hands it out; makes the chunks on first use (an error if that
  // fails). Never call it from a backend callback.
  StatusOr<StagingChunk*> Acquire();
  // Returns a chunk whose command has completed. Any thread; never blocks for long.
  void Release(StagingChunk* chunk);

  // A job for the worker: runs with OK, or with Cancelled when Shutdown came first (then on the
  // thread calling Shutdown).
  using Job = absl::AnyInvocable<void(Status) &&>;
  // Queues `job` (the worker starts on first use). FailedPrecondition, and the job is dropped
  // uncalled, after Shutdown.
  Status Submit(Job job);
  // Executor: `task` as a job (it runs whatever the job's status: on the worker, or with
  // Cancelled on the thread calling Shutdown), or at once on this thread after Shutdown.
  void Execute(absl::AnyInvocable<void() &&> task) override;
  // Stops taking jobs, runs every queued job with Cancelled, lets the running one finish and
  // joins the worker. Idempotent. Never call it from the worker or a callback.
  void Shutdown();

 private:
  Status AllocateChunksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(chunks_mutex_);
  void WorkerLoop();

  const std::string owner_;
  StagingChunkAllocator allocator_;
  const int num_chunks_;
  const int64_t chunk_bytes_;

  Mutex chunks_mutex_;
  std::condition_variable chunk_free_;
  // Made once under the lock; the destructor reads them when no chunk can be in use.
  std::vector<std::unique_ptr<StagingChunk>> chunks_ ABSL_GUARDED_BY(chunks_mutex_);
  std::vector<StagingChunk*> free_chunks_ ABSL_GUARDED_BY(chunks_mutex_);

  Mutex jobs_mutex_;
  std::condition_variable job_available_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(jobs_mutex_);
  bool stopping_ ABSL_GUARDED_BY(jobs_mutex_) = false;
  std::thread worker_ ABSL_GUARDED_BY(jobs_mutex_);
};

// One chunk's part of a dense device tensor: `size_bytes` at byte `offset_bytes`; `last` for the
// final piece of the tensor.
struct StagedPiece {
  int64_t offset_bytes = 0;
  int64_t size_bytes = 0;
  bool last = false;
};

// Called when the device has taken a written chunk's bytes (or a read chunk's bytes have landed):
// exactly once, on any thread, with the command's status.
using ChunkDone = absl::AnyInvocable<void(Status) &&>;

// Hands a filled chunk to the device: starts writing `piece` of the destination from `chunk` and
// arranges for `done` to run once the chunk may be reused; or returns an error and never calls
// `done`. An empty tensor is one empty piece with `last` set.
using ChunkWriter =
    absl::FunctionRef<Status(const StagingChunk& chunk, const StagedPiece& piece, ChunkDone done)>;

// Starts reading `piece` of the device tensor into `chunk` and arranges for `landed` to run once
// the bytes are there (a backend may also run it before returning); or returns an error and
// never calls `landed`.
using ChunkReader = absl::FunctionRef<Status(const StagingChunk& chunk, const StagedPiece& piece,
                                             ChunkDone landed)>;

// Writes the elements of `src`, converted to `device_dtype`, through `ring` into a dense device
// tensor: one chunk at a time (whole rows where a row fits), each filled by the fused
// copy-convert while the previous ones are in flight. Adds a piece to `counter` per chunk handed
// to `write`; that piece completes when its `done` runs. Returns once every chunk is handed over,
// or with the first error (chunks already handed over still complete their pieces).
Status StagedWrite(StagingRing& ring, const HostView& src, DType device_dtype, ChunkWriter write,
                   const std::shared_ptr<PieceCounter>& counter);

// Reads a dense device tensor of `device_dtype` and the dims of `dst` into `dst` through `ring`:
// each chunk is converted into `dst` by the thread that runs its `landed`, then returned. Pieces
// and errors as StagedWrite.
Status StagedRead(StagingRing& ring, DType device_dtype, const MutableHostView& dst,
                  ChunkReader read, const std::shared_ptr<PieceCounter>& counter);

}  // namespace ferry
