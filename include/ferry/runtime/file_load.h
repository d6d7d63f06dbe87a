// Loading the tensors of tensor files onto a device or a mesh: what `ferry put` and
// `load_file(path, device)` run.
//
// The tensors go window by window (consecutive runs of at most `window_bytes` of the files):
//   - where the device's buffers are host memory this process writes, the tensors stored as they
//     are kept are read from the file straight into them with pread (ReadFileTensors,
//     file_read.h), never mapped;
//   - the others are put from the file's mapping (TransferToDevice, or TransferShardsToDevice for
//     a tensor with a sharding), while the next window's mapped pages are faulted in by
//     `read_threads` threads; once a window is on its devices its pages leave the process
//     (MappedFile::ReleasePages), except where a device array aliases them (zero_copy).
// So a load holds the device copy and about two windows of the files, not the files and the copy.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"

namespace ferry {

// Whether a device dtype asked for a whole load (`ferry put --device-dtype`, load_file's
// device_dtype) applies to a tensor stored as `stored`: only to tensors of its own kind (a
// floating-point request to floating-point tensors, an integer one to integers), so that
// bfloat16 applies to the weights and leaves integer ids alone. The storage-only float8 types
// convert to nothing else, so a request never applies across them.
bool RequestAppliesTo(DType requested, DType stored);

// One tensor to load. Non-owning: the entry and the file outlive the call.
struct FileLoadTensor {
  const TensorFileEntry* entry = nullptr;
  const MappedFile* file = nullptr;  // the entry's file
  // The device dtype asked for; nullopt: each device's profile decides.
  std::optional<DType> requested_dtype;
  // Set: spread over its mesh (TransferShardsToDevice); unset: on the load's device.
  std::optional<Sharding> sharding;
};

struct FileLoadResult {
  DataPtr data;            // on the load's device
  ShardedDataPtr sharded;  // over the tensor's mesh
  bool read_in_place = false;
};

struct FileLoadOptions {
  HostBufferSemantics semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  // At most this many bytes of the files a window (at least one tensor); 0: one window.
  int64_t window_bytes = int64_t{256} << 20;
  // Reads in flight: pread threads, and threads faulting in the next window.
  int read_threads = 1;
  // The size of each pread into device memory.
  int64_t read_bytes = int64_t{8} << 20;
  // Called on the calling thread once each tensor is on its device(s), with the bytes loaded so
  // far (for a progress bar).
  std::function<void(int64_t)> progress;
  // Called on the calling thread after each window: an error it returns ends the load with that
  // error (how a caller stops a long load: Python's Ctrl-C).
  std::function<Status()> after_window;
};

// The options the settings give (FERRY_LOAD_WINDOW_BYTES, FERRY_LOAD_READ_THREADS,
// FERRY_LOAD_READ_BYTES); InvalidArgument naming a bad value. Without FERRY_LOAD_READ_THREADS: one
// read thread per core on a quiet machine, more while other work keeps the cores busy
// (src/runtime/read_threads.h).
StatusOr<FileLoadOptions> FileLoadOptionsFromSettings();

// Loads every tensor, in order (the files' data order keeps each window one stretch of a file),
// onto `device` (which may be null when every tensor has a sharding); returns when every tensor is
// ready, with one result per tensor. The first error, naming its tensor, ends the load (the
// handles made are released); a file truncated while it was read is DataLoss naming it.
// Threads: any; blocks the calling thread.
StatusOr<std::vector<FileLoadResult>> LoadFileTensors(absl::Span<const FileLoadTensor> tensors,
                                                      Device* device,
                                                      const FileLoadOptions& options);

}  // namespace ferry
