// The device API, part 4: create-then-fill. A `BufferWriter` makes a device buffer first and
// takes its bytes afterwards, in pieces at any offsets and in any order (PJRT's
// AsyncHostToDeviceTransferManager), so a producer that has the data only piece by piece (a
// file read in chunks, a converting or strided source streamed through a staging ring, a network
// receive) never needs a full-size host temporary. Made by `Client::CreateBufferWriter`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "ferry/core/dtype.h"
#include "ferry/core/future.h"
#include "ferry/core/host_view.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"
#include "ferry/device/buffer.h"

namespace ferry {

// Ownership: the caller owns the writer; the buffer it hands out (TakeBuffer) is owned by whoever
// takes it and may outlive the writer. The buffer's Ready() completes once every byte has been
// written, or with the error that ended the fill: a failed write, Abort(), or the writer destroyed
// before every byte arrived (Aborted). Bytes are the buffer's dense row-major device bytes, as
// they are: no conversion (the staging ring does that before it writes).
// Threads: every method is thread-safe; writes are applied one at a time in the order they take
// the writer's lock.
class BufferWriter {
 public:
  // Aborts the fill (Aborted, naming the bytes missing) unless every byte has been written.
  virtual ~BufferWriter();
  BufferWriter(const BufferWriter&) = delete;
  BufferWriter& operator=(const BufferWriter&) = delete;

  DType device_dtype() const { return device_dtype_; }
  const Dims& dims() const { return dims_; }
  int64_t size_bytes() const { return size_bytes_; }
  // The memory space the buffer lives in (Device::memory_spaces()).
  const std::string& memory_kind() const { return memory_kind_; }

  // Copies `size_bytes` bytes from `data` to byte `offset_bytes` of the buffer. The returned future
  // completes once `data` may be reused (the caller keeps it alive and unchanged until then).
  // InvalidArgument for a range outside the buffer, a null `data` with a non-empty range, or a
  // range that overlaps one written before; FailedPrecondition once the fill has ended (complete,
  // aborted or failed). The write that completes the buffer marks it ready.
  Future<> Write(int64_t offset_bytes, const void* data, int64_t size_bytes);

  // Filling in place, for a producer that writes memory itself (a file read with pread straight
  // into the buffer: the load then holds one copy of the bytes). Where the backend's buffer is
  // host memory this process may write (the host backend), the address of its byte 0; nullptr
  // where it is not (use Write). The producer writes a range of it, then reports the range with
  // Written; it writes only ranges it has not written or reported before, and none after the fill
  // has ended. Ranges of one buffer may be written from several threads at once.
  virtual void* HostWritableBytes() { return nullptr; }
  // Records [offset_bytes, offset_bytes + size_bytes), written in place at HostWritableBytes(), as
  // Write would record it (the range that completes the buffer marks it ready), without copying.
  // The same errors as Write, and FailedPrecondition where the buffer has no host-writable bytes.
  Status Written(int64_t offset_bytes, int64_t size_bytes);

  // The buffer, once (FailedPrecondition after that). It may be taken before, during or after
  // the writes; reads of it wait for Ready().
  StatusOr<std::unique_ptr<Buffer>> TakeBuffer();

  // Ends the fill with `status` (not OK): the buffer's Ready() completes with it. No-op once the
  // fill has ended.
  void Abort(Status status);

  // Bytes written so far.
  int64_t bytes_written() const;

 protected:
  BufferWriter(DType device_dtype, Dims dims, int64_t size_bytes, std::string memory_kind,
               std::string name);

  // The backend's part. WriteBytes copies (or starts copying) one validated, non-overlapping
  // range and returns when `data` may be reused (`data` is null for a range written in place,
  // reported by Written: nothing to copy); `last` is set on the write that completes the
  // buffer (exactly once, possibly on an empty range for an empty buffer), after which the
  // backend completes the buffer's Ready(). An error returned here ends the fill (FailBuffer
  // follows). Called with the writer's fill lock held (one call at a time, never beside
  // FailBuffer) but not its state lock: a future it completes may run continuations that ask the
  // writer anything (its fill has ended for them on the `last` write); the backend itself never
  // calls back into the writer.
  virtual StatusOr<Future<>> WriteBytes(int64_t offset_bytes, const void* data, int64_t size_bytes,
                                        bool last) = 0;
  // Fails the buffer with `status` (its Ready() completes with it). Called at most once, never
  // after the `last` write.
  virtual void FailBuffer(Status status) = 0;
  // Hands out the buffer (called once).
  virtual std::unique_ptr<Buffer> MakeBuffer() = 0;

  // Backends call this from their destructor (a virtual call from ~BufferWriter would not reach
  // them): aborts an unfinished fill.
  void AbortIfUnfinished();
  // Backends call this once the writer is made: an empty buffer is complete at once (its one
  // `last` write is empty).
  void CompleteIfEmpty();

  const std::string& name() const { return name_; }

 private:
  const DType device_dtype_;
  const Dims dims_;
  const int64_t size_bytes_;
  const std::string memory_kind_;
  const std::string name_;

  // Write and Written: records the range, then has the backend copy `data` (null: in place).
  Future<> RecordAndWrite(std::string_view what, int64_t offset_bytes, const void* data,
                          int64_t size_bytes);
  // Adds [begin, end) to written_.
  void RecordRange(int64_t begin, int64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // FailedPrecondition once the fill has ended.
  Status EndedError() const;

  // Two locks, so that no future is ever completed under a lock a continuation may need:
  // - fill_mutex_ serialises the backend's part (WriteBytes, FailBuffer): no write slips in
  //   between an abort's check and its FailBuffer. Held while the backend completes Ready(), so
  //   it is taken only while the fill has not ended: a continuation (which runs once it has)
  //   never waits for it.
  // - mutex_ guards the state below; never held while the backend runs.
  Mutex fill_mutex_ ABSL_ACQUIRED_BEFORE(mutex_);
  mutable Mutex mutex_;
  // Written ranges, [begin, end) keyed by begin, merged when they touch.
  std::map<int64_t, int64_t> written_ ABSL_GUARDED_BY(mutex_);
  int64_t bytes_written_ ABSL_GUARDED_BY(mutex_) = 0;
  bool ended_ ABSL_GUARDED_BY(mutex_) = false;
  bool taken_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace ferry
