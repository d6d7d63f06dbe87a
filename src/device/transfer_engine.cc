#include "src/device/transfer_engine.h"

#include <algorithm>
#include <system_error>

#include "ferry/core/runtime_thread.h"

namespace ferry {

TransferEngine::TransferEngine(int num_workers, int64_t chunk_bytes)
    : chunk_bytes_(std::max<int64_t>(chunk_bytes, 4096)) {
  workers_.reserve(std::max(num_workers, 1));
  for (int i = 0; i < std::max(num_workers, 1); ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error&) {
      // No more threads to be had (a thread or memory limit): the engine runs on those that
      // started; with none, the caller gets the error (nothing is left running).
      if (workers_.empty()) throw;
      break;
    }
  }
}

TransferEngine::~TransferEngine() { Shutdown(); }

Status TransferEngine::Submit(CopyConvertPlan plan, OnComplete on_complete) {
  auto job = std::make_shared<Job>();
  job->plan = std::move(plan);
  job->on_complete = std::move(on_complete);
  const int64_t total = job->plan.num_elements();
  // A chunk moves at most chunk_bytes_ on the wider side, and holds whole rows where a row fits,
  // so each chunk is a few long kernel calls.
  const int64_t bytes_per_element =
      std::max(DTypeSize(job->plan.src_dtype()), DTypeSize(job->plan.dst_dtype()));
  int64_t chunk_elements = std::max<int64_t>(1, chunk_bytes_ / bytes_per_element);
  const int64_t row = job->plan.row_elements();
  if (row <= chunk_elements) chunk_elements -= chunk_elements % row;
  job->chunk_elements = chunk_elements;
  // An empty plan is one empty chunk: its completion runs on a worker like any other, never on
  // the submitting thread (which may hold what the completion takes: a lock, the GIL).
  job->num_chunks = std::max<int64_t>(1, (total + chunk_elements - 1) / chunk_elements);
  {
    MutexLock lock(mutex_);
    if (stopping_) return FailedPreconditionError("the host transfer engine has shut down");
    queue_.push_back(job);
  }
  // Wake as many workers as there are chunks to run.
  if (job->num_chunks == 1) {
    work_available_.notify_one();
  } else {
    work_available_.notify_all();
  }
  return OkStatus();
}

bool TransferEngine::IsJobDone(const Job& job) const {
  return job.finished == job.claimed && (job.claimed == job.num_chunks || job.cancelled);
}

void TransferEngine::WorkerLoop() {
  RuntimeThreadScope runtime_thread;
  MutexLock lock(mutex_);
  while (true) {
    while (!stopping_ && queue_.empty()) lock.Wait(work_available_);
    if (queue_.empty()) return;  // stopping, nothing left to run
    std::shared_ptr<Job> job = queue_.front();
    const int64_t chunk = job->claimed++;
    if (job->claimed == job->num_chunks) queue_.pop_front();
    lock.Unlock();

    const int64_t begin = chunk * job->chunk_elements;
    const int64_t end = std::min(begin + job->chunk_elements, job->plan.num_elements());
    job->plan.CopyElements(begin, end);

    lock.Lock();
    ++job->finished;
    if (IsJobDone(*job)) {
      const bool cancelled = job->cancelled;
      lock.Unlock();
      std::move(job->on_complete)(cancelled ? CancelledError("the client shut down before the "
                                                             "transfer finished")
                                            : OkStatus());
      job.reset();  // release the plan's memory references before taking the lock again
      lock.Lock();
    }
  }
}

void TransferEngine::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    std::vector<std::shared_ptr<Job>> cancelled_now;
    {
      MutexLock lock(mutex_);
      stopping_ = true;
      for (auto& job : queue_) {
        job->cancelled = true;
        // Jobs with running chunks complete on the worker that finishes the last one.
        if (IsJobDone(*job)) cancelled_now.push_back(job);
      }
      queue_.clear();
    }
    work_available_.notify_all();
    for (auto& job : cancelled_now) {
      std::move(job->on_complete)(
          CancelledError("the client shut down before the transfer started"));
    }
    for (std::thread& worker : workers_) worker.join();
  });
}

StatusOr<Future<>> WriteThroughEngine(TransferEngine& engine, CopyConvertPlan plan,
                                      HostBufferSemantics semantics, OnDoneWithHostBuffer on_done,
                                      std::shared_ptr<const void> device_memory,
                                      std::shared_ptr<void> hold_until_ready) {
  if (semantics == HostBufferSemantics::kImmutableOnlyDuringCall) {
    if (SaturatedProduct(plan.num_elements(), DTypeSize(plan.src_dtype())) <= kInlineWriteBytes) {
      plan.CopyAll();
    } else {
      // Spread the copy over the workers and wait: the call may not return before the source has
      // been read.
      Promise<> copied;
      FERRY_RETURN_IF_ERROR(
          engine.Submit(std::move(plan), [copied](Status status) { copied.Set(status); }));
      FERRY_RETURN_IF_ERROR(copied.future().Await());
    }
    if (on_done) std::move(on_done)();
    return Future<>::Ready(OkStatus());
  }
  Promise<> ready;
  FERRY_RETURN_IF_ERROR(
      engine.Submit(std::move(plan),
                    [ready, on_done = std::move(on_done), device_memory = std::move(device_memory),
                     hold = std::move(hold_until_ready)](Status status) mutable {
                      device_memory.reset();
                      if (on_done) {
                        OnDoneWithHostBuffer release = std::move(on_done);
                        std::move(release)();
                      }
                      ready.Set(std::move(status));
                      hold.reset();
                    }));
  return ready.future();
}

}  // namespace ferry
