#include "ferry/runtime/transfer.h"

#include <optional>

#include "ferry/core/convert.h"
#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "ferry/core/runtime_thread.h"
#include "ferry/device/buffer_writer.h"
#include "ferry/device/client.h"
#include "ferry/distributed/global_devices.h"
#include "ferry/runtime/dtype_policy.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/runtime/parallel_for.h"
#include "src/runtime/transfer_internal.h"

namespace ferry {

Data::Data(std::unique_ptr<Buffer> buffer, DType logical_dtype, std::string name)
    : buffer_(std::move(buffer)),
      ready_(buffer_->Ready()),
      logical_dtype_(logical_dtype),
      name_(std::move(name)),
      device_name_(buffer_->device()->name()) {
  metrics::CreateDataHandles()->Add();
}

Data::Data(std::unique_ptr<Buffer> buffer, DType logical_dtype, std::string name,
           Future<> source_read)
    : Data(std::move(buffer), logical_dtype, std::move(name)) {
  source_read_ = std::move(source_read);
  // The buffer's error first (a failed transfer), then the read's.
  ready_ = JoinFutures({ready_, source_read_});
}

Data::~Data() { metrics::DestroyDataHandles()->Add(); }

Future<> Data::ToHost(const MutableHostView& dst) const {
  Future<> read = buffer_->ToHost(dst);
  if (source_read_.IsReady() && source_read_.Await().ok()) return read;
  return JoinFutures({std::move(read), source_read_});
}

namespace internal {

PendingReads::~PendingReads() { AwaitAll(); }

HostTensor& PendingReads::Hold(HostTensor tensor) {
  tensors_.push_back(std::move(tensor));
  return tensors_.back();
}

std::vector<Status> PendingReads::AwaitAll() {
  std::vector<Status> statuses;
  statuses.reserve(reads_.size());
  for (const Future<>& read : reads_) statuses.push_back(read.Await());
  return statuses;
}

std::vector<HostTensor> PendingReads::TakeTensors() {
  std::vector<HostTensor> tensors(std::make_move_iterator(tensors_.begin()),
                                  std::make_move_iterator(tensors_.end()));
  tensors_.clear();
  return tensors;
}

namespace {

// The device bytes one host chunk of a put into a non-default memory space holds (two of them).
constexpr int64_t kMemorySpaceChunkBytes = int64_t{8} << 20;

// `view` restricted to rows [begin, end) of its first dim.
HostView LeadingRows(const HostView& view, int64_t begin, int64_t end) {
  HostView rows = view;
  rows.dims[0] = end - begin;
  rows.data = static_cast<const std::byte*>(view.data) + begin * view.byte_strides[0];
  return rows;
}

// A put into memory space `space` of `device` through the backend's create-then-fill writer: a
// dense source of the device dtype is written as it is; any other is converted by leading-dim
// rows into two alternating host chunks, each written once the write before it has let go of it.
// Reads the whole source before it returns, then runs `on_done`.
StatusOr<std::unique_ptr<Buffer>> PutIntoMemorySpace(const HostView& view, DType device_dtype,
                                                     Device* device, const MemorySpace& space,
                                                     HostBufferSemantics semantics,
                                                     OnDoneWithHostBuffer on_done,
                                                     const std::string& name) {
  FERRY_RETURN_IF_ERROR(view.ComputeAddressedBytes(name).status());
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<BufferWriter> writer,
      device->client()->CreateBufferWriter(device_dtype, view.dims, device, space.kind, name));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  if (semantics == HostBufferSemantics::kImmutableZeroCopy) metrics::ZeroCopyFallbacks()->Add();
  Status written = OkStatus();
  if (writer->size_bytes() == 0) {
    // Complete at its start.
  } else if (view.dtype == device_dtype && view.IsRowMajorDense() && view.IsNativeByteOrder()) {
    written = writer->Write(0, view.data, writer->size_bytes()).Await();
  } else {
    metrics::ConvertedTransfers()->Add();
    const HostView source = view.rank() == 0 ? HostView(view.data, view.dtype, {1}, {0}) : view;
    const int64_t rows = source.dims[0];
    const int64_t row_bytes = writer->size_bytes() / rows;
    const int64_t rows_per_chunk = std::max<int64_t>(1, kMemorySpaceChunkBytes / row_bytes);
    Dims chunk_dims = source.dims;
    chunk_dims[0] = std::min(rows, rows_per_chunk);
    std::vector<HostTensor> chunks;
    std::vector<Future<>> in_flight;
    for (int i = 0; i < 2 && written.ok(); ++i) {
      StatusOr<HostTensor> chunk = HostTensor::Allocate(device_dtype, chunk_dims);
      if (!chunk.ok()) written = chunk.status();
      if (chunk.ok()) chunks.push_back(*std::move(chunk));
      in_flight.push_back(Future<>::Ready(OkStatus()));
    }
    for (int64_t begin = 0, k = 0; begin < rows && written.ok(); begin += rows_per_chunk, ++k) {
      const int64_t end = std::min(rows, begin + rows_per_chunk);
      HostTensor& chunk = chunks[k % 2];
      written = in_flight[k % 2].Await();  // the chunk's previous bytes have been taken
      if (!written.ok()) break;
      Dims dims = source.dims;
      dims[0] = end - begin;
      const MutableHostView target = MutableHostView::Dense(chunk.data(), device_dtype, dims);
      written = CopyConvert(LeadingRows(source, begin, end), target);
      if (!written.ok()) break;
      in_flight[k % 2] = writer->Write(begin * row_bytes, chunk.data(), (end - begin) * row_bytes);
    }
    for (const Future<>& write : in_flight) {  // no chunk is freed while a write still reads it
      if (Status status = write.Await(); written.ok()) written = status;
    }
  }
  if (!written.ok()) {
    writer->Abort(written);
    return written;  // on_done is dropped, not called: the call failed (client.h)
  }
  if (on_done) std::move(on_done)();
  return buffer;
}

// Starts one transfer; `on_done` runs once the source has been read (as `semantics` says).
StatusOr<DataPtr> StartTransfer(const DeviceTransfer& transfer, size_t index,
                                HostBufferSemantics semantics, OnDoneWithHostBuffer on_done) {
  const std::shared_ptr<const TensorSource>& source = transfer.source;
  if (source == nullptr) {
    return InvalidArgumentError(fmt::format("TransferToDevice: source {} is null", index));
  }
  Device* device = transfer.device;
  const HostView& view = source->view();
  bool downcast = false;
  StatusOr<DType> chosen = ChooseDeviceDType(view.dtype, transfer.device_dtype,
                                             device->capabilities(), source->name(), &downcast);
  if (!chosen.ok()) {
    // Which device: on a mesh mixing backends only some of them lack the dtype.
    return Status(chosen.status().code(),
                  fmt::format("{} ({})", std::string(chosen.status().message()),
                              distributed::NameInJob(*device)));
  }
  const DType device_dtype = *chosen;
  if (Status convertible = CheckConvertible(view.dtype, device_dtype); !convertible.ok()) {
    return Status(convertible.code(), fmt::format("tensor '{}': {}", source->name(),
                                                  std::string(convertible.message())));
  }
  if (Status readable = CheckConvertible(device_dtype, view.dtype); !readable.ok()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': storing {} as {} would make it unreadable in its own dtype: {}",
                    source->name(), DTypeName(view.dtype), DTypeName(device_dtype),
                    std::string(readable.message())));
  }
  if (downcast) metrics::SourceDowncasts()->Add();
  StatusOr<MemorySpace> found = FindMemorySpace(*device, transfer.memory_kind);
  if (!found.ok()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': {}", source->name(), std::string(found.status().message())));
  }
  const MemorySpace& space = *found;
  // A source that can tell whether what was read is its data (a mapped file truncated under the
  // read reads as zeros) is asked once it has been read, before the transfer lets go of it; the
  // handle's Ready() carries the answer. An alias is never "read" here (the device reads the
  // source later, for the buffer's whole life): it is not checked.
  std::optional<Promise<>> source_checked;
  if (source->ChecksReads() && semantics != HostBufferSemantics::kImmutableZeroCopy) {
    source_checked.emplace();
    on_done = [checked = *source_checked, checked_source = source,
               inner = std::move(on_done)]() mutable {
      checked.Set(checked_source->CheckRead());
      checked_source.reset();
      if (inner) std::move(inner)();
    };
  }
  std::unique_ptr<Buffer> buffer;
  if (space.is_default) {
    FERRY_ASSIGN_OR_RETURN(
        buffer, device->client()->BufferFromHostBuffer(view, device_dtype, device, semantics,
                                                       std::move(on_done), source->name()));
  } else {
    FERRY_ASSIGN_OR_RETURN(buffer, PutIntoMemorySpace(view, device_dtype, device, space, semantics,
                                                      std::move(on_done), source->name()));
  }
  metrics::OutboundData()->AddSample(static_cast<double>(view.dense_size_bytes()));
  if (source_checked.has_value()) {
    return std::make_shared<Data>(std::move(buffer), view.dtype, source->name(),
                                  source_checked->future());
  }
  return std::make_shared<Data>(std::move(buffer), view.dtype, source->name());
}

}  // namespace

StatusOr<std::vector<DataPtr>> StartTransfers(absl::Span<const DeviceTransfer> transfers,
                                              HostBufferSemantics semantics) {
  const bool only_during_call = semantics == HostBufferSemantics::kImmutableOnlyDuringCall;
  const bool overlap = only_during_call && transfers.size() > 1;
  auto is_large = [&](const DeviceTransfer& transfer) {
    return overlap && transfer.source != nullptr &&
           transfer.source->view().dense_size_bytes() >= kOverlapMinBytes;
  };
  std::vector<Future<>> sources_read;  // of the sources started asynchronously
  auto wait_for_sources = [&sources_read] {
    if (!sources_read.empty()) JoinFutures(sources_read).Await();
  };
  // On error `handles` goes out of scope: everything this call started is released.
  std::vector<DataPtr> handles(transfers.size());
  // All or nothing, device memory included: on an error, the transfers this call started run to
  // their end before their handles go, so that what they allocated is free once the error is
  // returned (a host transfer's copy holds its memory until it ends; before, a retry right after
  // a failed put could fail for want of the memory the abandoned one still held).
  // Not on a runtime thread (a put chained on another's Ready() runs there): what it would wait
  // for may be queued behind that thread; there the memory comes back when those transfers end.
  auto fail = [&](Status error) -> Status {
    wait_for_sources();  // the caller may reuse the sources once this returns
    if (!OnRuntimeThread()) {
      for (const DataPtr& handle : handles) {
        if (handle != nullptr) handle->Ready().Await().IgnoreError();
      }
    }
    return error;
  };
  // The transfer owns a reference to its source until it has read the last byte; the completion
  // callback drops it (on a runtime thread for asynchronous semantics).
  auto start = [&](size_t i, HostBufferSemantics this_semantics) -> Status {
    const std::shared_ptr<const TensorSource>& source = transfers[i].source;
    OnDoneWithHostBuffer on_done = [keep_alive = source]() mutable { keep_alive.reset(); };
    FERRY_ASSIGN_OR_RETURN(handles[i],
                           StartTransfer(transfers[i], i, this_semantics, std::move(on_done)));
    return OkStatus();
  };

  // First the large sources, each started asynchronously so that they overlap.
  std::vector<size_t> small;
  small.reserve(transfers.size());
  for (size_t i = 0; i < transfers.size(); ++i) {
    if (!is_large(transfers[i])) {
      small.push_back(i);
      continue;
    }
    Promise<> read;
    OnDoneWithHostBuffer on_done = [keep_alive = transfers[i].source, read]() mutable {
      keep_alive.reset();
      read.Set(OkStatus());
    };
    StatusOr<DataPtr> handle = StartTransfer(
        transfers[i], i, HostBufferSemantics::kImmutableUntilTransferCompletes, std::move(on_done));
    if (!handle.ok()) return fail(handle.status());
    sources_read.push_back(read.future());
    handles[i] = *std::move(handle);
  }

  // Then the others. Under kImmutableOnlyDuringCall each is copied on the thread that starts it,
  // so a large batch of them is started on every core; otherwise one by one, in order.
  if (only_during_call && small.size() >= kParallelMinTransfers) {
    std::vector<Status> errors(small.size());
    ParallelFor(small.size(), kParallelGrainTransfers,
                [&](size_t k) { errors[k] = start(small[k], semantics); });
    for (const Status& error : errors) {  // the first in the sources' order
      if (!error.ok()) return fail(error);
    }
  } else {
    for (size_t i : small) {
      if (Status started = start(i, semantics); !started.ok()) return fail(started);
    }
  }
  wait_for_sources();
  return handles;
}

}  // namespace internal

StatusOr<std::vector<DataPtr>> TransferToDevice(
    absl::Span<const std::shared_ptr<const TensorSource>> sources, Device* device,
    const TransferToDeviceOptions& options) {
  ScopedTimer timer(metrics::TransferToDeviceTime());
  if (device == nullptr) return InvalidArgumentError("TransferToDevice: no device given");
  if (!options.device_dtypes.empty() && options.device_dtypes.size() != sources.size()) {
    return InvalidArgumentError(fmt::format(
        "TransferToDevice: {} device dtypes for {} sources (give none, or one per source)",
        options.device_dtypes.size(), sources.size()));
  }
  std::vector<internal::DeviceTransfer> transfers;
  transfers.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    transfers.push_back({sources[i], device,
                         options.device_dtypes.empty() ? std::nullopt : options.device_dtypes[i],
                         options.memory_kind});
  }
  return internal::StartTransfers(transfers, options.semantics);
}

namespace {

// `status` (not OK) of a read of `handle`, naming the tensor and its device.
Status ReadingError(const Data& handle, const Status& status) {
  return Status(status.code(), fmt::format("reading tensor '{}' from {}: {}", handle.name(),
                                           handle.device_name(), std::string(status.message())));
}

}  // namespace

StatusOr<std::vector<HostTensor>> TransferFromDevice(absl::Span<const DataPtr> data,
                                                     const TransferFromDeviceOptions& options) {
  ScopedTimer timer(metrics::TransferFromDeviceTime());
  // Owns the destinations: an early return below waits for the reads already started.
  internal::PendingReads pending;
  // Start every read before waiting on any.
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == nullptr) {
      return InvalidArgumentError(fmt::format("TransferFromDevice: data handle {} is null", i));
    }
    const Data& handle = *data[i];
    const DType host_dtype =
        options.in_device_dtype ? handle.device_dtype() : handle.logical_dtype();
    StatusOr<HostTensor> allocated = HostTensor::Allocate(host_dtype, handle.dims());
    if (!allocated.ok()) return ReadingError(handle, allocated.status());
    HostTensor& tensor = pending.Hold(*std::move(allocated));
    if (host_dtype != handle.device_dtype()) metrics::ConvertedTransfers()->Add();
    pending.Add(handle.ToHost(tensor.mutable_view()));
  }
  const std::vector<Status> statuses = pending.AwaitAll();
  std::vector<HostTensor> tensors = pending.TakeTensors();
  Status first_error;
  for (size_t i = 0; i < statuses.size(); ++i) {
    const Status& status = statuses[i];
    if (!status.ok() && first_error.ok()) first_error = ReadingError(*data[i], status);
    if (status.ok())
      metrics::InboundData()->AddSample(static_cast<double>(tensors[i].size_bytes()));
  }
  if (!first_error.ok()) return first_error;
  return tensors;
}

Future<> TransferFromDeviceInto(absl::Span<const DataPtr> data,
                                absl::Span<const MutableHostView> dst) {
  if (data.size() != dst.size()) {
    return Future<>::Ready(InvalidArgumentError(fmt::format(
        "TransferFromDeviceInto: {} destinations for {} data handles", dst.size(), data.size())));
  }
  // Everything is checked before the first read starts: a bad argument writes nothing.
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == nullptr) {
      return Future<>::Ready(
          InvalidArgumentError(fmt::format("TransferFromDeviceInto: data handle {} is null", i)));
    }
    const Data& handle = *data[i];
    if (Status valid = CheckToHostArgs(handle.dims(), handle.device_dtype(), dst[i]); !valid.ok()) {
      return Future<>::Ready(ReadingError(handle, valid));
    }
  }
  std::vector<Future<>> reads;
  reads.reserve(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const DataPtr& handle = data[i];
    if (dst[i].dtype != handle->device_dtype()) metrics::ConvertedTransfers()->Add();
    Promise<> named;
    // The callback holds the handle until its read is over (and lets go of it before the read
    // counts as complete), and names the tensor in its error.
    handle->ToHost(dst[i]).OnReady(
        [named, held = handle, bytes = dst[i].dense_size_bytes()](const Status& status) mutable {
          Status result;
          if (status.ok()) {
            metrics::InboundData()->AddSample(static_cast<double>(bytes));
          } else {
            result = ReadingError(*held, status);
          }
          held.reset();
          named.Set(std::move(result));
        });
    reads.push_back(named.future());
  }
  return JoinFutures(reads);
}

StatusOr<std::vector<DataPtr>> CopyToDevice(absl::Span<const DataPtr> data, Device* target) {
  if (target == nullptr) return InvalidArgumentError("CopyToDevice: no target device");
  if (!target->is_addressable()) {
    return InvalidArgumentError(fmt::format(
        "CopyToDevice: {} is another process's device; a process copies to its own only",
        target->name()));
  }
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == nullptr) {
      return InvalidArgumentError(fmt::format("CopyToDevice: data handle {} is null", i));
    }
    if (!target->capabilities().Holds(data[i]->device_dtype())) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}': {} cannot hold {}, the dtype {} stores it in: put the data again, in a "
          "dtype the device holds",
          data[i]->name(), target->name(), DTypeName(data[i]->device_dtype()),
          data[i]->device_name()));
    }
  }
  std::vector<DataPtr> copies;
  copies.reserve(data.size());
  for (const DataPtr& handle : data) {
    StatusOr<std::unique_ptr<Buffer>> copy = handle->buffer().CopyToDevice(target);
    if (!copy.ok()) {
      return Status(
          copy.status().code(),
          fmt::format("copying tensor '{}' from {} to {}: {}", handle->name(),
                      handle->device_name(), target->name(), std::string(copy.status().message())));
    }
    // A copy is only as good as what it copies: its Ready() waits for the original's too.
    copies.push_back(std::make_shared<Data>(*std::move(copy), handle->logical_dtype(),
                                            handle->name(), handle->Ready()));
  }
  return copies;
}

Status AwaitReady(absl::Span<const DataPtr> data) {
  Status first_error;
  for (size_t i = 0; i < data.size(); ++i) {
    const DataPtr& handle = data[i];
    if (handle == nullptr) {  // another process's shard, say: nothing here to wait for
      return InvalidArgumentError(fmt::format("AwaitReady: data handle {} is null", i));
    }
    const Status& status = handle->Ready().Await();
    if (!status.ok() && first_error.ok()) {
      first_error = Status(status.code(), fmt::format("tensor '{}': {}", handle->name(),
                                                      std::string(status.message())));
    }
  }
  return first_error;
}

}  // namespace ferry
