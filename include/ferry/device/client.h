// The device API, part 3: `Client`, the entry point of one backend.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/device/buffer.h"
#include "ferry/device/buffer_writer.h"
#include "ferry/device/device.h"

namespace ferry {

// One backend's runtime: owns its devices and the machinery that moves data to them.
// A client must outlive the `Device*` it hands out. Destroying a client with transfers in flight
// is safe: queued work is cancelled (its buffers' Ready() completes with Cancelled and every
// `on_done` still runs exactly once), running work finishes, and no thread is left behind.
// All methods are thread-safe.
class Client {
 public:
  virtual ~Client() = default;

  // "host", "opencl", ...
  virtual std::string_view backend() const = 0;
  // Non-owning; valid for the life of the client.
  virtual absl::Span<Device* const> devices() const = 0;

  // Starts a transfer of `src` to `device`, stored as `device_dtype` (which may differ from
  // `src.dtype`: element sizes and strides always come from `src`). Returns the new buffer at
  // once; its Ready() completes when the data has arrived. The caller owns the buffer.
  //
  // `src` must be valid for its memory (HostView::ValidateWithin); the memory must stay valid
  // and unchanged as `semantics` says. `on_done` (may be empty) runs exactly once when the call
  // succeeds, as `semantics` says; when the call fails it is not called and the error names
  // `tensor_name`: InvalidArgument (bad view, dtype the device cannot hold or cannot convert
  // to), Unimplemented (storage-only dtype conversion), ResourceExhausted (out of device memory),
  // FailedPrecondition (client shutting down).
  virtual StatusOr<std::unique_ptr<Buffer>> BufferFromHostBuffer(
      const HostView& src, DType device_dtype, Device* device, HostBufferSemantics semantics,
      OnDoneWithHostBuffer on_done, std::string_view tensor_name = "tensor") = 0;

  // Create-then-fill (buffer_writer.h): makes a buffer of `dims` in `device_dtype` on `device`,
  // in its memory space `memory_kind` (the default for an empty kind), whose bytes arrive later
  // through the returned writer. Errors as BufferFromHostBuffer (named `tensor_name`), and
  // InvalidArgument for a memory kind the device does not have.
  virtual StatusOr<std::unique_ptr<BufferWriter>> CreateBufferWriter(
      DType device_dtype, const Dims& dims, Device* device, std::string_view memory_kind = {},
      std::string_view tensor_name = "tensor") = 0;
};

// Checks shared by every backend before a CreateBufferWriter: `device` belongs to `client`, holds
// `device_dtype`, the dims are valid and `memory_kind` names one of its spaces. Returns the
// buffer's size in bytes and its memory space.
struct WriterPlacement {
  int64_t size_bytes = 0;
  MemorySpace memory;
};
StatusOr<WriterPlacement> CheckCreateBufferWriterArgs(const Client& client, DType device_dtype,
                                                      const Dims& dims, const Device* device,
                                                      std::string_view memory_kind,
                                                      std::string_view tensor_name);

// Checks shared by every backend before a transfer starts: `device` belongs to `client`, the
// device holds `device_dtype`, the dtypes convert, the view is self-consistent. Errors name
// `tensor_name`.
Status CheckBufferFromHostBufferArgs(const Client& client, const HostView& src, DType device_dtype,
                                     const Device* device, std::string_view tensor_name);

// The bytes `src` occupies on `device` stored as `device_dtype`: InvalidArgument when that
// overflows int64, ResourceExhausted when it passes the device's max_buffer_bytes (the message
// names `limit_name`, the limit's origin, when given). Errors name `tensor_name`.
StatusOr<int64_t> DeviceBytesFor(const HostView& src, DType device_dtype, const Device& device,
                                 std::string_view tensor_name, std::string_view limit_name = {});

}  // namespace ferry
