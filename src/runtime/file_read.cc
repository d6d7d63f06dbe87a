#include "ferry/runtime/file_read.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "ferry/core/prefault.h"
#include "ferry/device/buffer_writer.h"
#include "ferry/device/client.h"
#include "ferry/runtime/dtype_policy.h"
#include "fmt/format.h"

namespace ferry {
namespace {

// A tensor being read in place: its writer and where its bytes go.
struct InPlaceTensor {
  size_t index = 0;  // in the caller's span
  const FileTensorRead* read = nullptr;
  std::unique_ptr<BufferWriter> writer;
  std::byte* destination = nullptr;
  int64_t size_bytes = 0;
};

// One pread: bytes [offset, offset + size) of tensor `tensor`'s stored bytes.
struct ReadPiece {
  size_t tensor = 0;  // in the InPlaceTensor list
  int64_t offset = 0;
  int64_t size = 0;
};

// Runs every piece's read on `num_threads` threads (the caller's among them); the error of the
// first failed piece in order (not in time: the same error whichever thread gets there first),
// naming its tensor and file, or OK. After an error the pieces not started are skipped; those
// started (all before it in order among them: pieces are taken in order) finish.
Status ReadPieces(absl::Span<const InPlaceTensor> tensors, absl::Span<const ReadPiece> pieces,
                  int num_threads) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Mutex error_mutex;
  Status first_error;
  size_t first_error_piece = pieces.size();
  const auto work = [&] {
    for (size_t i = next.fetch_add(1); i < pieces.size() && !failed.load(); i = next.fetch_add(1)) {
      const ReadPiece& piece = pieces[i];
      const InPlaceTensor& tensor = tensors[piece.tensor];
      // Fresh device memory (a load's usual destination) is faulted in with one call per MiB
      // rather than a fault per page inside pread.
      PrefaultForWriting(tensor.destination + piece.offset, piece.size);
      const Status read = tensor.read->file->ReadAt(tensor.read->file_offset + piece.offset,
                                                    piece.size, tensor.destination + piece.offset);
      if (!read.ok()) {
        MutexLock lock(error_mutex);
        if (i < first_error_piece) {
          first_error_piece = i;
          first_error =
              Status(read.code(), fmt::format("tensor '{}': {}", tensor.read->source->name(),
                                              std::string(read.message())));
        }
        failed.store(true);
        return;
      }
    }
  };
  std::vector<std::thread> helpers;
  const int helper_count =
      std::clamp<int>(num_threads, 1, static_cast<int>(std::max<size_t>(pieces.size(), 1))) - 1;
  helpers.reserve(helper_count);
  for (int t = 0; t < helper_count; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the reads run on those that started, and this one
    }
  }
  work();
  for (std::thread& helper : helpers) helper.join();
  MutexLock lock(error_mutex);
  return first_error;
}

}  // namespace

FileTensorRead FileTensorRead::Of(const TensorFileEntry& entry, const MappedFile* file,
                                  std::optional<DType> requested_dtype) {
  return {entry.source.get(), file, entry.zero_copy ? entry.file_offset : -1, requested_dtype};
}

FileTensorRead FileTensorRead::OfMemory(const TensorSource* source,
                                        std::optional<DType> requested_dtype) {
  FileTensorRead read{source, nullptr, -1, requested_dtype};
  const HostView& view = source->view();
  if (!view.IsRowMajorDense()) return read;
  if (auto location = MappedFile::Locate(view.data, view.dense_size_bytes())) {
    read.file = location->file;
    read.file_offset = location->offset;
  }
  return read;
}

bool FileReadApplies(const FileTensorRead& read, const Device& device) {
  if (read.source == nullptr || read.file == nullptr || !read.file->is_mapped() ||
      read.file_offset < 0) {
    return false;
  }
  const HostView& view = read.source->view();
  if (!view.IsRowMajorDense() || !view.IsNativeByteOrder() ||
      view.dense_size_bytes() < kMinFileReadBytes) {
    return false;
  }
  // A dtype the device cannot hold, or another than the stored one, is the mapped path's (which
  // converts, or says why it cannot).
  StatusOr<DType> device_dtype = ChooseDeviceDType(view.dtype, read.requested_dtype,
                                                   device.capabilities(), read.source->name());
  return device_dtype.ok() && *device_dtype == view.dtype;
}

bool DeviceMemoryIsHostWritable(Device& device) {
  if (device.client() == nullptr) return false;
  StatusOr<std::unique_ptr<BufferWriter>> writer =
      device.client()->CreateBufferWriter(DType::kU8, Dims{1}, &device, {}, "host-writable probe");
  if (!writer.ok()) return false;
  const bool writable = (*writer)->HostWritableBytes() != nullptr;
  (*writer)->Abort(AbortedError("a probe of the device's memory, never filled"));
  return writable;
}

StatusOr<std::vector<DataPtr>> ReadFileTensors(absl::Span<const FileTensorRead> tensors,
                                               Device* device, int read_threads,
                                               int64_t read_bytes) {
  // Reads are cut into pieces so that one large tensor keeps every thread busy.
  read_bytes = std::max<int64_t>(read_bytes, 4096);
  std::vector<DataPtr> result(tensors.size());
  if (device == nullptr || device->client() == nullptr) {
    return InvalidArgumentError("ReadFileTensors: the device is null or has no client here");
  }
  std::vector<InPlaceTensor> in_place;
  std::vector<ReadPiece> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FileTensorRead& read = tensors[i];
    if (!FileReadApplies(read, *device)) continue;
    const HostView& view = read.source->view();
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<BufferWriter> writer,
                           device->client()->CreateBufferWriter(view.dtype, view.dims, device, {},
                                                                read.source->name()));
    auto* destination = static_cast<std::byte*>(writer->HostWritableBytes());
    if (destination == nullptr) {
      if (in_place.empty()) return result;  // the device's memory is not the host's: none applies
      continue;
    }
    const int64_t size = view.dense_size_bytes();
    for (int64_t offset = 0; offset < size; offset += read_bytes) {
      pieces.push_back({in_place.size(), offset, std::min(read_bytes, size - offset)});
    }
    in_place.push_back({i, &read, std::move(writer), destination, size});
  }
  // On an error the writers, destroyed unfinished, fail their buffers (Aborted); nothing is kept.
  FERRY_RETURN_IF_ERROR(ReadPieces(in_place, pieces, read_threads));
  for (InPlaceTensor& tensor : in_place) {
    FERRY_RETURN_IF_ERROR(tensor.writer->Written(0, tensor.size_bytes));
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buffer, tensor.writer->TakeBuffer());
    const TensorSource& source = *tensor.read->source;
    metrics::OutboundData()->AddSample(static_cast<double>(tensor.size_bytes));
    metrics::FileBytesReadInPlace()->Add(tensor.size_bytes);
    result[tensor.index] =
        std::make_shared<Data>(std::move(buffer), source.view().dtype, source.name());
  }
  return result;
}

}  // namespace ferry
