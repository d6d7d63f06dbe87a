// The transfer runtime: what users call to move tensors to and from devices.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/future.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/status.h"
#include "ferry/device/buffer.h"
#include "ferry/device/device.h"
#include "ferry/runtime/tensor_source.h"

namespace ferry {

// A handle to one tensor on a device. Shared (`DataPtr`); destroying the last reference frees
// the device memory (once no transfer still uses it). A handle may outlive the device's client:
// reads then fail with FailedPrecondition (naming the tensor and `device_name()`), and everything
// below except `device()` stays valid. Thread-safe.
class Data {
 public:
  // `buffer`'s client must be alive here (the device name is copied from it).
  Data(std::unique_ptr<Buffer> buffer, DType logical_dtype, std::string name);
  // The same, whose Ready() also waits for `source_read` and fails with its error: what the
  // transfer learnt once it had read the source (TensorSource::CheckRead: a mapped file truncated
  // under the read is DataLoss), or, for a copy of another handle, that handle's Ready().
  Data(std::unique_ptr<Buffer> buffer, DType logical_dtype, std::string name, Future<> source_read);
  ~Data();
  Data(const Data&) = delete;
  Data& operator=(const Data&) = delete;

  // The source's dtype: what reads return by default.
  DType logical_dtype() const { return logical_dtype_; }
  DType device_dtype() const { return buffer_->device_dtype(); }
  const Dims& dims() const { return buffer_->dims(); }
  // Non-owning; valid while the device's client lives (see device.h). Error messages and
  // anything that may run after the client is gone use device_name().
  Device* device() const { return buffer_->device(); }
  // "<backend>:<index>", copied when the handle was made: valid for the handle's life.
  const std::string& device_name() const { return device_name_; }
  const std::string& name() const { return name_; }
  Buffer& buffer() const { return *buffer_; }
  // Completes when the data is on the device and the source has been released; with an error if
  // the transfer failed or what it read was not the source's data (DataLoss).
  Future<> Ready() const { return ready_; }
  // Completes once the transfer has read its source, with what the source said of the read
  // (TensorSource::CheckRead); OK at once for a source that does not check. After a
  // kImmutableOnlyDuringCall transfer it is ready when TransferToDevice returns.
  Future<> SourceRead() const { return source_read_; }
  // Reads the data into `dst` (Buffer::ToHost), failing with the source's read error as well
  // (DataLoss for a source truncated under its transfer): use it rather than buffer().ToHost.
  Future<> ToHost(const MutableHostView& dst) const;

 private:
  std::unique_ptr<Buffer> buffer_;
  Future<> ready_;
  Future<> source_read_ = Future<>::Ready(OkStatus());
  DType logical_dtype_;
  std::string name_;
  std::string device_name_;
};

using DataPtr = std::shared_ptr<Data>;

struct TransferToDeviceOptions {
  HostBufferSemantics semantics = HostBufferSemantics::kImmutableOnlyDuringCall;
  // Empty, or one entry per source: an explicit device dtype for that source (nullopt: the
  // device's profile decides; see dtype_policy.h).
  std::vector<std::optional<DType>> device_dtypes;
  // The memory space every buffer goes to (Device::memory_spaces(): "device", "pinned_host", ...);
  // empty: the device's default. InvalidArgument, listing the device's spaces, for one it lacks.
  // A put into a space other than the default goes through the backend's create-then-fill
  // writer (Client::CreateBufferWriter), converting into at most two bounded host chunks, and
  // reads its source during the call whatever the semantics (on_done runs before it returns;
  // kImmutableZeroCopy never aliases there and counts a fallback).
  std::string memory_kind;
};

// Starts moving every source to `device` and returns one handle per source, in order, at once.
// Each transfer holds its source (the shared_ptr) until it has read it, then drops it on a
// runtime thread (for kImmutableOnlyDuringCall: before this returns).
// A device dtype from which the source's own dtype cannot be read back (a real source stored as
// complex) is InvalidArgument. All or nothing: if any source fails to start (bad view, dtype, out
// of device memory), the handles already made by this call are released and the error names that
// source; data that was on the device before the call is untouched. On such an error the call
// first lets the transfers it started run to their end, so that their device memory is free when
// it returns (a retry can use it) — except on a runtime thread (in a continuation of one of
// ferry's futures, say), where it never waits: that memory comes back when those transfers end.
StatusOr<std::vector<DataPtr>> TransferToDevice(
    absl::Span<const std::shared_ptr<const TensorSource>> sources, Device* device,
    const TransferToDeviceOptions& options = {});

struct TransferFromDeviceOptions {
  // Return each tensor in its device dtype instead of its logical (source) dtype.
  bool in_device_dtype = false;
};

// Starts every read before waiting on any, then waits for all. Returns dense host tensors in each
// handle's logical dtype (or device dtype). The first error, naming its tensor, if any fails.
StatusOr<std::vector<HostTensor>> TransferFromDevice(absl::Span<const DataPtr> data,
                                                     const TransferFromDeviceOptions& options = {});

// Starts reading every handle into the caller's view at the same position and returns at once: the
// returned future completes when every read has finished, OK or with the first error in argument
// order, naming its tensor and device. Each `dst[i]` has the dims of `data[i]` and any byte strides
// (transposed, stepped, negative: the caller's own array, written in place, with no intermediate
// copy); its dtype may differ from the device dtype and is converted on the way (convert.h rules;
// the logical dtype reads the data back as it was put). Every argument is checked before any read
// starts: a count mismatch, a null handle, a destination of other dims or an inconvertible dtype is
// a ready InvalidArgument (or Unimplemented) future, naming the tensor, and no destination byte was
// written. The caller keeps every destination's memory alive and does not touch it until the
// future completes; destinations must not overlap one another. The reads hold the handles until
// they finish (and no longer once the future has completed), so the caller may drop its own
// references at once. Never waits on the calling
// thread: the read of a handle whose put is still running starts once the put has finished.
Future<> TransferFromDeviceInto(absl::Span<const DataPtr> data,
                                absl::Span<const MutableHostView> dst);

// A copy of each handle on `target` (device to device), in order: same dims, logical dtype, device
// dtype and name, as an independent handle (the original may be dropped at once). Goes through
// Buffer::CopyToDevice: the backend's own copy between its devices where it has one (pjrt: the
// plugin's PJRT_Buffer_CopyToDevice, between devices of one plugin), else through host memory, on
// any backend's device. The copy's Ready() also waits for the original's (and fails with its
// error). Does not wait for the original's put or the copy (Buffer::CopyToDevice says where a
// backend must). InvalidArgument naming the tensor when `target` is null or cannot hold the device
// dtype (put the data again with TransferToDevice then, choosing a dtype), FailedPrecondition when
// a client is gone. All or nothing, as TransferToDevice.
StatusOr<std::vector<DataPtr>> CopyToDevice(absl::Span<const DataPtr> data, Device* target);

// Waits until every handle is ready; the first error if any failed. InvalidArgument for a null
// handle (ShardedData::shards() holds null for other processes' shards: pass
// addressable_shards()).
Status AwaitReady(absl::Span<const DataPtr> data);

}  // namespace ferry
