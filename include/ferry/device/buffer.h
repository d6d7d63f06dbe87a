// The device API, part 2: `Buffer`, one tensor held by a device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/core/dtype.h"
#include "ferry/core/future.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/device/native_handles.h"

namespace ferry {

class Device;

// A tensor on a device, dense row-major in `device_dtype`. Created by
// `Client::BufferFromHostBuffer`; the caller owns it (unique_ptr). Destroying a buffer frees its
// device memory once no transfer still uses it; a buffer may outlive its client (every later
// operation on it then fails with FailedPrecondition), but its device pointer does not.
// All methods are thread-safe.
class Buffer {
 public:
  virtual ~Buffer() = default;

  // Non-owning; valid while the client lives (like every Device*). Nothing else a buffer
  // offers reaches through it, so every other method is safe after the client is gone.
  virtual Device* device() const = 0;
  virtual DType device_dtype() const = 0;
  virtual const Dims& dims() const = 0;
  // Bytes the buffer occupies on the device.
  virtual int64_t size_bytes() const = 0;
  // True when the buffer aliases its host source (kImmutableZeroCopy on the host backend).
  virtual bool is_alias() const { return false; }
  // The memory space it lives in (Device::memory_spaces()).
  virtual std::string memory_kind() const { return "device"; }

  // Completes once the data is on the device and the host source has been released (the
  // `on_done` callback has returned), with an error status if the transfer failed or was
  // cancelled (Cancelled when the client shut down first).
  virtual Future<> Ready() const = 0;

  // Starts copying the buffer into `dst` (same dims; `dst.dtype` may differ from the device
  // dtype and is converted by the rules of convert.h). The caller keeps `dst`'s memory alive
  // and untouched until the returned future completes. Waits for Ready() first by itself, but
  // never on the calling thread: on a buffer still being filled it returns a pending future at
  // once (the conformance suite holds every backend to this).
  virtual Future<> ToHost(const MutableHostView& dst) = 0;

  // On backends whose memory the host can read (the host backend): a read-only view of the
  // device data, valid while the buffer lives and after Ready(); FailedPrecondition once the
  // client is gone. Others: Unimplemented.
  virtual StatusOr<HostView> HostAccessibleView() const;

  // The address of the buffer's first byte, for handing its memory to another runtime without a
  // copy (DLPack). Read through it only after Ready(); valid while the buffer lives. The default
  // is HostAccessibleView()'s data, in host memory; pjrt gives the plugin's device pointer on a
  // CUDA or ROCm plugin (PJRT_Buffer_OpaqueDeviceMemoryDataPointer). Unimplemented where the
  // runtime gives no address (opencl: a cl_mem is not a pointer; see NativeHandle()).
  virtual StatusOr<BufferAddress> DataAddress() const;

  // The backend's own object behind the buffer (native_handles.h says what it is per backend).
  // Unimplemented on backends without one (host); FailedPrecondition once the client is gone.
  virtual StatusOr<NativeBufferHandle> NativeHandle() const;

  // A partial read: copies `size_bytes` of the buffer's dense device bytes, starting at byte
  // `offset_bytes`, into `dst` as they are (no conversion). The caller keeps `dst` alive until
  // the future completes. Waits for Ready() first by itself; the backends' own implementations
  // (host, opencl, pjrt) never on the calling thread, as ToHost. InvalidArgument when the range
  // is not inside the buffer or `dst` is null with a non-empty range; FailedPrecondition once the
  // client is gone. The default (for a backend with none of its own) waits for Ready() on the
  // calling thread and reads through HostAccessibleView().
  virtual Future<> CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst);

  // A copy of this buffer on `target` (the same device included): same dims and device dtype.
  // The caller owns the result; its Ready() completes when the copy has arrived, or fails with
  // the error of the original's fill or of the copy. Never waits on the calling thread: a buffer
  // still being filled is copied once it is, and the original may be destroyed as soon as the
  // call returns (the copy holds what it still has to read). Backends that copy between their
  // devices do so (pjrt: PJRT_Buffer_CopyToDevice, ordered after the fill by the plugin, which
  // waits for the fill only on a plugin that cannot fail an unfilled buffer: no SetBufferError);
  // the default goes through the host, to any backend's device. An original that is ready and in
  // host memory (the host backend, pjrt on a CPU plugin) is put on `target` from that memory with
  // kImmutableUntilTransferCompletes, the target's own fastest put, which holds the memory until
  // it has been read (HoldHostAccessibleMemory). Else a buffer created to be filled later on
  // `target` (Client::CreateBufferWriter) takes the original's bytes once they are there: read
  // straight into it where the host can write its memory (CopyRawToHost; one copy), else into a
  // host tensor that is written on the background executor (src/core/background_executor.h). A
  // target that cannot create such a buffer (a pjrt plugin without a transfer manager, or tiled
  // layouts) takes the old way, which waits for the original's fill and read on the calling
  // thread. Errors found before anything started (a null or unfit target, a client gone) are
  // returned; later ones fail the copy's Ready().
  virtual StatusOr<std::unique_ptr<Buffer>> CopyToDevice(Device* target);

 protected:
  // For CopyToDevice's default: where HostAccessibleView() has the buffer's memory, an object
  // that keeps that memory valid and unchanged while it is held, also after the buffer is
  // destroyed. Null (the default) where the backend has none.
  virtual std::shared_ptr<const void> HoldHostAccessibleMemory() const { return nullptr; }
};

// Checks shared by every backend before a ToHost starts: `dst` has the buffer's dims, is
// self-consistent, its elements are distinct (MutableHostView::ElementsAreDistinct: no stride 0,
// no overlapping rows) and `device_dtype` converts to its dtype. InvalidArgument/Unimplemented
// else.
Status CheckToHostArgs(const Dims& buffer_dims, DType device_dtype, const MutableHostView& dst);

// Checks shared by every backend before a CopyRawToHost starts: [offset, offset + size) lies in
// `buffer_bytes` and `dst` is not null for a non-empty range. InvalidArgument else.
Status CheckRawRange(int64_t buffer_bytes, int64_t offset_bytes, int64_t size_bytes,
                     const void* dst);

}  // namespace ferry
