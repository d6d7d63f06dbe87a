#include "ferry/runtime/file_load.h"

#include <algorithm>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

#include "ferry/core/settings.h"
#include "ferry/runtime/file_read.h"
#include "src/runtime/read_threads.h"

namespace ferry {
namespace {

// A stretch of one mapped file: what a window's mapped tensors of that file cover.
struct FileStretch {
  const MappedFile* file = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
};

// Whether `tensor`'s bytes lie in its file's mapping (not an inflated .npz member).
bool StoredInMapping(const FileLoadTensor& tensor) {
  return tensor.entry->zero_copy && tensor.entry->file_offset >= 0 && tensor.file != nullptr;
}

int64_t BytesOf(const FileLoadTensor& tensor) {
  return tensor.entry->source->view().dense_size_bytes();
}

// The load's state: the tensors, their results, and which are read in place.
class FileLoad {
 public:
  FileLoad(absl::Span<const FileLoadTensor> tensors, Device* device, const FileLoadOptions& options)
      : tensors_(tensors), device_(device), options_(options), results_(tensors.size()) {}

  StatusOr<std::vector<FileLoadResult>> Run() {
    MarkReadsInPlace();
    const size_t count = tensors_.size();
    size_t begin = 0;
    size_t end = WindowEnd(0);
    FaultIn(0, end);
    while (begin < count) {
      const size_t next_end = WindowEnd(end);
      std::thread next_window;
      try {
        next_window = std::thread([this, end, next_end] { FaultIn(end, next_end); });
      } catch (const std::system_error&) {
        // No thread to be had: the next window's pages fault in as it is read.
      }
      Status loaded = ReadInPlace(begin, end);
      if (loaded.ok()) loaded = StartPuts(begin, end);
      if (loaded.ok()) loaded = AwaitWindow(begin, end);
      if (next_window.joinable()) next_window.join();
      FERRY_RETURN_IF_ERROR(loaded);
      ReleasePages(begin, end);
      if (options_.after_window) FERRY_RETURN_IF_ERROR(options_.after_window());
      begin = end;
      end = next_end;
    }
    // A file truncated while mapped was read as zeros where its pages vanished (MappedFile turns
    // the SIGBUS into that): an error naming the file, not a result.
    for (const FileLoadTensor& tensor : tensors_) {
      if (tensor.file != nullptr) FERRY_RETURN_IF_ERROR(tensor.file->CheckIntact());
    }
    return std::move(results_);
  }

 private:
  // On a device whose buffers are host memory, the unsharded tensors ReadFileTensors takes.
  void MarkReadsInPlace() {
    if (device_ == nullptr || options_.semantics == HostBufferSemantics::kImmutableZeroCopy ||
        std::all_of(tensors_.begin(), tensors_.end(),
                    [](const FileLoadTensor& tensor) { return tensor.sharding.has_value(); }) ||
        !DeviceMemoryIsHostWritable(*device_)) {
      return;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      results_[i].read_in_place =
          !tensors_[i].sharding.has_value() && FileReadApplies(ReadOf(i), *device_);
    }
  }

  FileTensorRead ReadOf(size_t i) const {
    return FileTensorRead::Of(*tensors_[i].entry, tensors_[i].file, tensors_[i].requested_dtype);
  }

  size_t WindowEnd(size_t begin) const {
    const int64_t limit =
        options_.window_bytes > 0 ? options_.window_bytes : std::numeric_limits<int64_t>::max();
    int64_t bytes = 0;
    size_t end = begin;
    while (end < tensors_.size() && (end == begin || bytes + BytesOf(tensors_[end]) <= limit)) {
      bytes += BytesOf(tensors_[end++]);
    }
    return end;
  }

  // The mapped bytes of tensors [begin, end) that the puts read: one stretch per file (a window's
  // tensors of one file come in data order).
  std::vector<FileStretch> MappedStretches(size_t begin, size_t end) const {
    std::vector<FileStretch> stretches;
    for (size_t i = begin; i < end; ++i) {
      const FileLoadTensor& tensor = tensors_[i];
      if (!StoredInMapping(tensor) || results_[i].read_in_place) continue;
      const int64_t from = tensor.entry->file_offset;
      const int64_t to = from + BytesOf(tensor);
      auto same = std::find_if(stretches.begin(), stretches.end(),
                               [&](const FileStretch& s) { return s.file == tensor.file; });
      if (same == stretches.end()) {
        stretches.push_back({tensor.file, from, to});
      } else {
        same->begin = std::min(same->begin, from);
        same->end = std::max(same->end, to);
      }
    }
    return stretches;
  }

  void FaultIn(size_t begin, size_t end) const {
    for (const FileStretch& s : MappedStretches(begin, end)) {
      s.file->Prefetch(s.begin, s.end - s.begin, options_.read_threads);
    }
  }

  Status ReadInPlace(size_t begin, size_t end) {
    std::vector<size_t> chosen;
    std::vector<FileTensorRead> reads;
    for (size_t i = begin; i < end; ++i) {
      if (!results_[i].read_in_place) continue;
      chosen.push_back(i);
      reads.push_back(ReadOf(i));
    }
    if (chosen.empty()) return OkStatus();
    FERRY_ASSIGN_OR_RETURN(
        std::vector<DataPtr> read,
        ReadFileTensors(reads, device_, options_.read_threads, options_.read_bytes));
    for (size_t k = 0; k < chosen.size(); ++k) {
      // A tensor the reader did not take after all is put from the mapping (StartPuts); its
      // pages, not faulted in ahead, come in as the put reads them.
      results_[chosen[k]].read_in_place = read[k] != nullptr;
      results_[chosen[k]].data = std::move(read[k]);
    }
    return OkStatus();
  }

  // Starts the puts of the window's tensors not read in place: one batched TransferToDevice for
  // those on the device, one TransferShardsToDevice per sharded tensor.
  Status StartPuts(size_t begin, size_t end) {
    TransferToDeviceOptions options;
    options.semantics = options_.semantics;
    std::vector<std::shared_ptr<const TensorSource>> sources;
    std::vector<size_t> unsharded;
    for (size_t i = begin; i < end; ++i) {
      const FileLoadTensor& tensor = tensors_[i];
      if (results_[i].data != nullptr) continue;
      if (tensor.sharding.has_value()) {
        TransferToDeviceOptions shard_options;
        shard_options.semantics = options_.semantics;
        if (tensor.requested_dtype.has_value()) {
          shard_options.device_dtypes = {tensor.requested_dtype};
        }
        FERRY_ASSIGN_OR_RETURN(
            results_[i].sharded,
            TransferShardsToDevice(tensor.entry->source, *tensor.sharding, shard_options));
        continue;
      }
      sources.push_back(tensor.entry->source);
      options.device_dtypes.push_back(tensor.requested_dtype);
      unsharded.push_back(i);
    }
    if (sources.empty()) return OkStatus();
    if (device_ == nullptr) {
      return InvalidArgumentError("LoadFileTensors: a tensor without a sharding and no device");
    }
    FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> data, TransferToDevice(sources, device_, options));
    for (size_t k = 0; k < unsharded.size(); ++k) results_[unsharded[k]].data = std::move(data[k]);
    return OkStatus();
  }

  Status AwaitWindow(size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const FileLoadResult& result = results_[i];
      // This process's shards only: those of another process's devices are null here.
      FERRY_RETURN_IF_ERROR(result.sharded ? AwaitReady(result.sharded->addressable_shards())
                                           : AwaitReady({result.data}));
      done_bytes_ += BytesOf(tensors_[i]);
      if (options_.progress) options_.progress(done_bytes_);
    }
    return OkStatus();
  }

  // Gives back the window's mapped pages, except where a device array aliases them.
  void ReleasePages(size_t begin, size_t end) const {
    for (size_t i = begin; i < end; ++i) {
      const FileLoadTensor& tensor = tensors_[i];
      const FileLoadResult& result = results_[i];
      if (!StoredInMapping(tensor) || result.read_in_place) continue;
      // Not where a device array of this process aliases the pages.
      const std::vector<DataPtr> held =
          result.sharded ? result.sharded->addressable_shards() : std::vector<DataPtr>{result.data};
      if (std::any_of(held.begin(), held.end(),
                      [](const DataPtr& data) { return data->buffer().is_alias(); })) {
        continue;
      }
      tensor.file->ReleasePages(tensor.entry->file_offset, BytesOf(tensor));
    }
  }

  const absl::Span<const FileLoadTensor> tensors_;
  Device* const device_;
  const FileLoadOptions& options_;
  std::vector<FileLoadResult> results_;
  int64_t done_bytes_ = 0;
};

}  // namespace

bool RequestAppliesTo(DType requested, DType stored) {
  const DTypeInfo& requested_info = GetDTypeInfo(requested);
  const DTypeInfo& stored_info = GetDTypeInfo(stored);
  if (requested != stored && (requested_info.storage_only || stored_info.storage_only)) {
    return false;
  }
  const auto integer = [](DTypeKind kind) {
    return kind == DTypeKind::kSignedInt || kind == DTypeKind::kUnsignedInt;
  };
  return requested_info.kind == stored_info.kind ||
         (integer(requested_info.kind) && integer(stored_info.kind));
}

StatusOr<FileLoadOptions> FileLoadOptionsFromSettings() {
  FileLoadOptions options;
  FERRY_ASSIGN_OR_RETURN(options.window_bytes, settings::LoadWindowBytes());
  FERRY_ASSIGN_OR_RETURN(options.read_bytes, settings::LoadReadBytes());
  FERRY_ASSIGN_OR_RETURN(const std::optional<int> threads, settings::LoadReadThreads());
  options.read_threads = threads.has_value() ? *threads : DefaultLoadReadThreads();
  return options;
}

StatusOr<std::vector<FileLoadResult>> LoadFileTensors(absl::Span<const FileLoadTensor> tensors,
                                                      Device* device,
                                                      const FileLoadOptions& options) {
  for (const FileLoadTensor& tensor : tensors) {
    if (tensor.entry == nullptr || tensor.entry->source == nullptr) {
      return InvalidArgumentError("LoadFileTensors: a tensor without its file entry");
    }
  }
  return FileLoad(tensors, device, options).Run();
}

}  // namespace ferry
