#include "ferry/device/buffer_writer.h"

#include <iterator>
#include <utility>

#include "fmt/format.h"

namespace ferry {

BufferWriter::BufferWriter(DType device_dtype, Dims dims, int64_t size_bytes,
                           std::string memory_kind, std::string name)
    : device_dtype_(device_dtype),
      dims_(std::move(dims)),
      size_bytes_(size_bytes),
      memory_kind_(std::move(memory_kind)),
      name_(std::move(name)) {}

BufferWriter::~BufferWriter() = default;

int64_t BufferWriter::bytes_written() const {
  MutexLock lock(mutex_);
  return bytes_written_;
}

Future<> BufferWriter::Write(int64_t offset_bytes, const void* data, int64_t size_bytes) {
  if (Status status = CheckRawRange(size_bytes_, offset_bytes, size_bytes, data); !status.ok()) {
    return Future<>::Ready(InvalidArgumentError(
        fmt::format("write to tensor '{}': {}", name_, std::string(status.message()))));
  }
  return RecordAndWrite("write", offset_bytes, data, size_bytes);
}

Status BufferWriter::Written(int64_t offset_bytes, int64_t size_bytes) {
  void* base = HostWritableBytes();
  if (base == nullptr) {
    return FailedPreconditionError(fmt::format(
        "tensor '{}' on {}: its buffer is not host memory this process can write; use Write", name_,
        memory_kind_));
  }
  if (Status status = CheckRawRange(size_bytes_, offset_bytes, size_bytes, base); !status.ok()) {
    return InvalidArgumentError(
        fmt::format("in-place write to tensor '{}': {}", name_, std::string(status.message())));
  }
  Future<> recorded = RecordAndWrite("in-place write", offset_bytes, nullptr, size_bytes);
  return recorded.Await();
}

Future<> BufferWriter::RecordAndWrite(std::string_view what, int64_t offset_bytes, const void* data,
                                      int64_t size_bytes) {
  // A write after the end is refused without the fill lock: a continuation on Ready() runs while
  // the write that completed the buffer still holds it.
  if (Status ended = EndedError(); !ended.ok()) return Future<>::Ready(ended);
  MutexLock fill(fill_mutex_);
  const int64_t end = offset_bytes + size_bytes;
  bool last = false;
  {
    MutexLock lock(mutex_);
    if (ended_) {
      return Future<>::Ready(FailedPreconditionError(fmt::format(
          "{} to tensor '{}': its fill has ended (complete, aborted or failed)", what, name_)));
    }
    if (size_bytes == 0) return Future<>::Ready(OkStatus());
    // The first range that ends after this one begins must begin at or after this one's end.
    auto next = written_.upper_bound(offset_bytes);
    if (next != written_.begin()) {
      auto previous = std::prev(next);
      if (previous->second > offset_bytes) next = previous;
    }
    if (next != written_.end() && next->first < end) {
      return Future<>::Ready(InvalidArgumentError(
          fmt::format("{} to tensor '{}': bytes [{}, {}) overlap bytes [{}, {}) written before",
                      what, name_, offset_bytes, end, next->first, next->second)));
    }
    // Recorded before the backend runs: a continuation of the last write sees every byte, and
    // the fill has ended for it. Undone below if the backend refuses the write.
    RecordRange(offset_bytes, end);
    bytes_written_ += size_bytes;
    last = bytes_written_ == size_bytes_;
    if (last) ended_ = true;
  }
  StatusOr<Future<>> written = WriteBytes(offset_bytes, data, size_bytes, last);
  if (!written.ok()) {
    {
      MutexLock lock(mutex_);
      ended_ = true;
      bytes_written_ -= size_bytes;
    }
    FailBuffer(written.status());
    return Future<>::Ready(written.status());
  }
  return *std::move(written);
}

void BufferWriter::RecordRange(int64_t begin, int64_t end) {
  // Merged with its neighbours when they touch.
  int64_t stop = end;
  auto after = written_.find(end);
  if (after != written_.end()) {
    stop = after->second;
    written_.erase(after);
  }
  auto before = written_.lower_bound(begin);
  if (before != written_.begin() && std::prev(before)->second == begin) {
    --before;
    begin = before->first;
    written_.erase(before);
  }
  written_[begin] = stop;
}

Status BufferWriter::EndedError() const {
  MutexLock lock(mutex_);
  if (!ended_) return OkStatus();
  return FailedPreconditionError(
      fmt::format("write to tensor '{}': its fill has ended (complete, aborted or failed)", name_));
}

StatusOr<std::unique_ptr<Buffer>> BufferWriter::TakeBuffer() {
  MutexLock lock(mutex_);
  if (taken_) {
    return FailedPreconditionError(
        fmt::format("the buffer of tensor '{}' was taken from its writer already", name_));
  }
  taken_ = true;
  return MakeBuffer();
}

void BufferWriter::Abort(Status status) {
  {
    MutexLock lock(mutex_);
    if (ended_) return;  // without the fill lock: a continuation on Ready() may call this
  }
  // The fill lock keeps a write from running between the check and FailBuffer; ended_ is set
  // before FailBuffer completes Ready(), whose continuations may call back into the writer.
  MutexLock fill(fill_mutex_);
  {
    MutexLock lock(mutex_);
    if (ended_) return;
    ended_ = true;
  }
  if (status.ok()) status = AbortedError(fmt::format("the fill of tensor '{}' was aborted", name_));
  FailBuffer(std::move(status));
}

void BufferWriter::AbortIfUnfinished() {
  int64_t missing = 0;
  {
    MutexLock lock(mutex_);
    if (ended_) return;
    missing = size_bytes_ - bytes_written_;
  }
  Abort(AbortedError(
      fmt::format("the writer of tensor '{}' was destroyed with {} of its {} bytes never written",
                  name_, missing, size_bytes_)));
}

void BufferWriter::CompleteIfEmpty() {
  MutexLock fill(fill_mutex_);
  {
    MutexLock lock(mutex_);
    if (size_bytes_ != 0 || ended_) return;
    ended_ = true;
  }
  static const std::byte kNothing{};
  if (StatusOr<Future<>> done = WriteBytes(0, &kNothing, 0, /*last=*/true); !done.ok()) {
    FailBuffer(done.status());
  }
}

}  // namespace ferry
