// TransferEngine: the device layer's CPU copy engine, shared by the backends whose memory the host
// addresses (host, the pjrt backend's direct path, ferry's PJRT plugin).
//
// A fixed pool of worker threads runs copy jobs (a CopyConvertPlan) in chunks of at most
// `chunk_bytes` of destination. Jobs run in FIFO order; the chunks of one job are spread over all
// idle workers, so a large transfer uses every core and a queue of small ones costs one chunk
// each. Bytes in flight are bounded by workers x chunk_bytes: nothing is staged, chunks write
// straight into their destination.
//
// Threading: Submit and Shutdown may be called from any thread, including from a job's completion
// callback (which runs on a worker). Shutdown must not be called from a worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "ferry/core/copy_convert.h"
#include "ferry/core/future.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"

namespace ferry {

class TransferEngine {
 public:
  // Runs once per job: OK after its last chunk, or Cancelled when Shutdown dropped chunks of it.
  // Runs on the worker that finished the job's last chunk, or on the thread calling Shutdown.
  using OnComplete = absl::AnyInvocable<void(Status) &&>;

  static constexpr int64_t kDefaultChunkBytes = int64_t{8} << 20;

  TransferEngine(int num_workers, int64_t chunk_bytes = kDefaultChunkBytes);
  // Calls Shutdown().
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Queues `plan`; the memory its views point at must stay valid until `on_complete` runs.
  // FailedPrecondition (and `on_complete` is not called) after Shutdown.
  Status Submit(CopyConvertPlan plan, OnComplete on_complete);

  // Stops accepting jobs, cancels every chunk not yet started, waits for running chunks, runs the
  // completion of every job and joins the workers. Idempotent.
  void Shutdown();

  int num_workers() const { return static_cast<int>(workers_.size()); }

 private:
  // The counters of a job are guarded by the engine's mutex_ (a member of another class, which
  // the annotations cannot name here; IsJobDone, which reads them, requires it).
  struct Job {
    CopyConvertPlan plan;
    OnComplete on_complete;
    int64_t chunk_elements = 1;
    int64_t num_chunks = 0;
    int64_t claimed = 0;     // chunks handed to workers (guarded by mutex_)
    int64_t finished = 0;    // chunks done (guarded by mutex_)
    bool cancelled = false;  // (guarded by mutex_)
  };

  void WorkerLoop();
  // True when `job` will run no more chunks and none is running.
  bool IsJobDone(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t chunk_bytes_;
  Mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  // Started by the constructor, joined by Shutdown; never changed in between.
  std::vector<std::thread> workers_;
  std::once_flag shutdown_once_;
};

// Writes a host source into device memory that the host addresses, as `semantics` says: what
// every backend with such memory does (host; pjrt on a CPU plugin).
// - kImmutableOnlyDuringCall: on this thread when the source has at most kInlineWriteBytes, else
//   spread over the engine's workers and waited for; `on_done` has run when this returns, and the
//   returned future is ready.
// - kImmutableUntilTransferCompletes: queued on the engine, which owns the rest: the job lets go
//   of `device_memory` (its hold on the memory it writes, which the buffer may drop mid-transfer)
//   before it runs `on_done`, so a caller woken by on_done that drops the buffer frees the memory
//   itself; it destroys `on_done` (and the source keep-alive it captured) before it completes the
//   returned future, so "ready" also means "the source has been released"; then it drops
//   `hold_until_ready`.
// Errors: those of Submit (the job is then dropped and `on_done` not called).
inline constexpr int64_t kInlineWriteBytes = int64_t{256} << 10;
StatusOr<Future<>> WriteThroughEngine(TransferEngine& engine, CopyConvertPlan plan,
                                      HostBufferSemantics semantics, OnDoneWithHostBuffer on_done,
                                      std::shared_ptr<const void> device_memory,
                                      std::shared_ptr<void> hold_until_ready = nullptr);

}  // namespace ferry
