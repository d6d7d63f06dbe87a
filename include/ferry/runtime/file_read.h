// Loading tensors of a file straight into device memory that the host can write.
//
// The mapped path of a load (TransferToDevice of a file's TensorSource) copies from the file's
// mapping: the process faults in the file's pages (and must give them back, ReleasePages) and
// copies them again into the device buffer. Where the device's buffer is host memory this process
// may write (BufferWriter::HostWritableBytes: the host backend), ReadFileTensors reads the bytes
// from the file into the buffer with pread (MappedFile::ReadAt) instead: the kernel copies from
// its page cache once, the process never maps them, and a load holds one copy of the bytes, the
// device's. Several reads are in flight at once (threads: a read blocks in the kernel, which is
// what makes a cold file come in at the disk's rate).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"
#include "ferry/runtime/transfer.h"

namespace ferry {

// One tensor of a file to load. Non-owning: the source and the file outlive the call.
struct FileTensorRead {
  // The tensor as stored, seen in the file's mapping: its view gives the dtype, dims, layout and
  // byte order, its name names the handle.
  const TensorSource* source = nullptr;
  // The file and the offset of the tensor's first byte in it; null / -1 where the tensor is not
  // stored there as its bytes (a compressed .npz member, memory of no file).
  const MappedFile* file = nullptr;
  int64_t file_offset = -1;
  // The device dtype asked for; nullopt: the device's profile decides (ChooseDeviceDType).
  std::optional<DType> requested_dtype;

  // A tensor of a TensorFile (its mapping `file`).
  static FileTensorRead Of(const TensorFileEntry& entry, const MappedFile* file,
                           std::optional<DType> requested_dtype);
  // A source whose memory may lie in a live mapping of a MappedFile (MappedFile::Locate): a
  // numpy view of a mapped file, say. Not in one: file stays null (the path does not apply).
  static FileTensorRead OfMemory(const TensorSource* source, std::optional<DType> requested_dtype);
};

// Tensors smaller than this take the mapped path (its batched puts cost less per tensor than a
// writer and a read each).
inline constexpr int64_t kMinFileReadBytes = int64_t{64} << 10;

// Whether ReadFileTensors takes `read` onto `device` where the device's buffers are host-writable:
// the conditions below that do not depend on the device's memory. For callers that prepare the
// other tensors meanwhile (fault in their mapped pages) and must skip these.
bool FileReadApplies(const FileTensorRead& read, const Device& device);

// Whether `device`'s buffers are host memory this process can write
// (BufferWriter::HostWritableBytes), asked of its backend with a one-byte writer, aborted.
bool DeviceMemoryIsHostWritable(Device& device);

// For each tensor, in order: a handle to it on `device`, read from its file in place, or nullptr
// where this path does not apply and the caller puts the tensor another way. It applies to a
// tensor of at least kMinFileReadBytes stored uncompressed, dense, in native byte order
// (TensorFileEntry::file_offset, its view), whose device dtype (chosen as TransferToDevice
// chooses it) is the stored one, on a device whose buffers are host-writable, in the device's
// default memory space. The reads are pieces of at most `read_bytes` spread over `read_threads`
// threads (the calling one among them; at least one); the call returns when every read is done, the
// handles ready. All or nothing: on the first error (a failed or short read: DataLoss for a file
// truncated since it was opened; the device out of memory), every handle made is released and
// the error names the tensor and the file.
// Threads: any; blocks the calling thread for the reads.
StatusOr<std::vector<DataPtr>> ReadFileTensors(absl::Span<const FileTensorRead> tensors,
                                               Device* device, int read_threads,
                                               int64_t read_bytes = int64_t{8} << 20);

}  // namespace ferry
