#include "src/device/pjrt/pjrt_buffer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "fmt/format.h"
#include "src/device/pjrt/pjrt_client.h"
#include "src/device/staging_ring.h"

namespace ferry::pjrt {
namespace {

constexpr int64_t kInlineReadBytes = int64_t{256} << 10;

int64_t DenseBytes(const PjrtBufferParts& parts) {
  return SaturatedProduct(SaturatedNumElements(parts.dims), DTypeSize(parts.device_dtype));
}

PjrtBuffer::ReadSource MakeReadSource(PjrtDevice* device, PjrtBufferParts parts) {
  auto* client = static_cast<PjrtClient*>(device->client());
  const int64_t size_bytes = DenseBytes(parts);
  return {.parts = std::move(parts),
          .device_name = device->name(),
          .lifetime = client->runtime()->lifetime(),
          .client = client,
          .device = device,
          .size_bytes = size_bytes};
}

// What a read through the plugin calls once its bytes have landed in host memory (or it failed):
// on the plugin's thread that completes its event, or on the calling thread when the plugin
// refuses the read or has finished it by the time it is asked.
using OnLanded = absl::AnyInvocable<void(Status) &&>;

// Reads the whole buffer, dense and row-major in its device dtype, into `dst` (`size_bytes`)
// through the plugin's ToHostBuffer, which lays it out whatever the device's layout is: with an
// explicit row-major host layout where the device's may be another (without one the plugin
// writes the device's own). Returns once the plugin has the read; `landed` follows.
void StartDenseReadThroughPlugin(const PjrtBufferHandle& handle, size_t rank, void* dst,
                                 int64_t size_bytes, bool ask_row_major, std::string what,
                                 OnLanded landed) {
  const PJRT_Api& api = handle.runtime().api();
  RowMajorLayout host_layout(rank);  // read by the plugin during the call
  auto args = FERRY_PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args);
  args.src = handle.get();
  if (ask_row_major) args.host_layout = host_layout.get();
  args.dst = dst;
  args.dst_size = static_cast<size_t>(size_bytes);
  if (Status called = handle.runtime().Check(api.PJRT_Buffer_ToHostBuffer(&args), what);
      !called.ok()) {
    std::move(landed)(std::move(called));
    return;
  }
  OnEventReady(api, args.event, std::move(landed), std::move(what));
}

// Starts a partial read, `size_bytes` of the buffer's dense bytes from `offset_bytes`, into
// `dst` (PJRT_Buffer_CopyRawToHost); `landed` is taken, and follows. An error when the plugin
// refuses the read, and then `landed` is left to the caller, not called.
Status StartRawReadThroughPlugin(const PjrtBufferHandle& handle, int64_t offset_bytes,
                                 int64_t size_bytes, void* dst, const std::string& what,
                                 OnLanded& landed) {
  const PJRT_Api& api = handle.runtime().api();
  auto args = FERRY_PJRT_ARGS(PJRT_Buffer_CopyRawToHost_Args);
  args.buffer = handle.get();
  args.dst = dst;
  args.offset = offset_bytes;
  args.transfer_size = size_bytes;
  FERRY_RETURN_IF_ERROR(handle.runtime().Check(api.PJRT_Buffer_CopyRawToHost(&args), what));
  OnEventReady(api, args.event, std::move(landed), what);
  return OkStatus();
}

// The same, waited for on this thread (for a read converted here once it has landed).
Status ReadDenseThroughPlugin(const PjrtBufferHandle& handle, size_t rank, void* dst,
                              int64_t size_bytes, bool ask_row_major, std::string_view what) {
  Promise<> landed;
  StartDenseReadThroughPlugin(handle, rank, dst, size_bytes, ask_row_major, std::string(what),
                              [landed](Status status) { landed.Set(std::move(status)); });
  return landed.future().Await();
}

}  // namespace

PjrtBufferHandle::~PjrtBufferHandle() {
  auto args = FERRY_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
  args.buffer = buffer_;
  runtime_->Check(runtime_->api().PJRT_Buffer_Destroy(&args), "PJRT_Buffer_Destroy").IgnoreError();
}

PjrtBuffer::PjrtBuffer(PjrtDevice* device, PjrtBufferParts parts)
    : device_(device), source_(MakeReadSource(device, std::move(parts))) {}

Device* PjrtBuffer::device() const { return device_; }

StatusOr<HostView> PjrtBuffer::HostAccessibleView() const {
  if (lifetime_->closed()) {
    return FailedPreconditionError(
        fmt::format("HostAccessibleView on {}: the pjrt client has been shut down", device_name_));
  }
  if (parts_.host_address == nullptr && size_bytes_ > 0) {
    return UnimplementedError(fmt::format(
        "HostAccessibleView: the memory of {} is not addressable from the host", device_name_));
  }
  return HostView::Dense(parts_.host_address, parts_.device_dtype, parts_.dims);
}

std::shared_ptr<const void> PjrtBuffer::HoldHostAccessibleMemory() const {
  if (parts_.host_address == nullptr) return nullptr;
  struct Held {
    std::shared_ptr<PjrtBufferHandle> handle;
    std::shared_ptr<void> memory;
  };
  return std::make_shared<const Held>(Held{parts_.handle, parts_.memory_keepalive});
}

StatusOr<BufferAddress> PjrtBuffer::DataAddress() const {
  StatusOr<ClientLifetime::Token> token =
      ClientLifetime::Begin(lifetime_, fmt::format("DataAddress on {}", device_name_));
  if (!token.ok()) return token.status();
  if (parts_.host_address != nullptr || size_bytes_ == 0) {
    return BufferAddress{AddressSpace::kHost, 0, parts_.host_address};
  }
  const PjrtClient& client = *source_.client;
  const std::optional<AddressSpace> space = DeviceAddressSpaceOf(client.platform().platform_name);
  if (space.has_value() && !client.platform().row_major_layouts) {
    return UnimplementedError(fmt::format(
        "DataAddress: {} does not lay its buffers out as dense row-major arrays, which is what an "
        "address means to DLPack and to ferry",
        device_name_));
  }
  if (!space.has_value()) {
    return UnimplementedError(fmt::format(
        "DataAddress: the memory of {} (platform {}) has no address ferry can hand out{}",
        device_name_, client.platform().platform_name,
        client.platform().buffers_on_cpu ? " without direct host access" : ""));
  }
  const PjrtRuntime& runtime = *client.runtime();
  const PJRT_Api& api = runtime.api();
  void* data = nullptr;
  if (FERRY_PJRT_HAS(runtime.library(), PJRT_Buffer_OpaqueDeviceMemoryDataPointer)) {
    auto args = FERRY_PJRT_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args);
    args.buffer = pjrt_buffer();
    FERRY_RETURN_IF_ERROR(runtime.Check(api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&args),
                                        "Buffer_OpaqueDeviceMemoryDataPointer"));
    data = args.device_memory_ptr;
  } else if (FERRY_PJRT_HAS(runtime.library(), PJRT_Buffer_UnsafePointer)) {
    auto args = FERRY_PJRT_ARGS(PJRT_Buffer_UnsafePointer_Args);
    args.buffer = pjrt_buffer();
    FERRY_RETURN_IF_ERROR(
        runtime.Check(api.PJRT_Buffer_UnsafePointer(&args), "Buffer_UnsafePointer"));
    data = reinterpret_cast<void*>(args.buffer_pointer);
  } else {
    return UnimplementedError(
        fmt::format("DataAddress on {}: the plugin gives no buffer pointers", device_name_));
  }
  auto hardware_id = FERRY_PJRT_ARGS(PJRT_Device_LocalHardwareId_Args);
  hardware_id.device = device_->pjrt_device();
  FERRY_RETURN_IF_ERROR(
      runtime.Check(api.PJRT_Device_LocalHardwareId(&hardware_id), "Device_LocalHardwareId"));
  return BufferAddress{*space, static_cast<int32_t>(hardware_id.local_hardware_id), data};
}

StatusOr<NativeBufferHandle> PjrtBuffer::NativeHandle() const {
  if (lifetime_->closed()) {
    return FailedPreconditionError(
        fmt::format("NativeHandle on {}: the pjrt client has been shut down", device_name_));
  }
  return NativeBufferHandle{pjrt_buffer()};
}

Future<> PjrtBuffer::CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) {
  if (Status status = CheckRawRange(size_bytes_, offset_bytes, size_bytes, dst); !status.ok()) {
    return Future<>::Ready(std::move(status));
  }
  std::string what = fmt::format("CopyRawToHost from {}", device_name_);
  StatusOr<ClientLifetime::Token> token = ClientLifetime::Begin(lifetime_, what);
  if (!token.ok()) return Future<>::Ready(token.status());
  if (parts_.ready.IsReady()) {
    return CopyRawOnceReady(source_, offset_bytes, size_bytes, dst, *std::move(token));
  }
  token->Release();
  // The put is still running: the read starts once it has finished, on the device's
  // device-to-host worker (never on the thread that completes the put), and this call returns at
  // once. The read holds what it needs (the source), not this buffer, and the client only from
  // then on (as ToHost: a client destroyed while a BufferWriter's fill is awaited must not wait
  // for this read).
  Promise<> done;
  parts_.ready.OnReady([source = source_, offset_bytes, size_bytes, dst, done,
                        what = std::move(what)](const Status&) mutable {
    StatusOr<ClientLifetime::Token> held = ClientLifetime::Begin(source.lifetime, what);
    if (!held.ok()) {
      done.Set(held.status());
      return;
    }
    const PjrtDevice* device = source.device;
    Status queued = device->RunOnStagingWorker(
        StagingDirection::kDeviceToHost, [source = std::move(source), offset_bytes, size_bytes, dst,
                                          done, token = *std::move(held)](Status start) mutable {
          if (!start.ok()) {
            done.Set(std::move(start));
            return;
          }
          CopyRawOnceReady(source, offset_bytes, size_bytes, dst, std::move(token))
              .OnReady([done](const Status& status) { done.Set(status); });
        });
    if (!queued.ok()) done.Set(std::move(queued));
  });
  return done.future();
}

Future<> PjrtBuffer::CopyRawOnceReady(const ReadSource& source, int64_t offset_bytes,
                                      int64_t size_bytes, void* dst, ClientLifetime::Token token) {
  const PjrtBufferParts& parts = source.parts;
  if (Status ready = parts.ready.Await(); !ready.ok()) return Future<>::Ready(std::move(ready));
  if (size_bytes == 0) return Future<>::Ready(OkStatus());
  if (parts.host_address != nullptr) {
    std::memcpy(dst, parts.host_address + offset_bytes, static_cast<size_t>(size_bytes));
    return Future<>::Ready(OkStatus());
  }
  // The read through the plugin, started on the device's device-to-host staging worker (one
  // stream of reads per device, in order) and reported when its event completes: the worker does
  // not wait for it. The plugins here write a read's bytes before they run its event's callbacks
  // (tests/plugin: the_wrapped_plugin_has_written_a_raw_reads_bytes_before_its_callbacks).
  const PjrtPlatformInfo& platform = source.client->platform();
  std::string what = fmt::format("CopyRawToHost from {}", source.device_name);
  absl::AnyInvocable<void(const PjrtBufferHandle&, OnLanded) &&> read;
  if (platform.reads_at_byte_offsets()) {
    read = [offset_bytes, size_bytes, dst, what](const PjrtBufferHandle& handle, OnLanded landed) {
      if (Status started =
              StartRawReadThroughPlugin(handle, offset_bytes, size_bytes, dst, what, landed);
          !started.ok()) {
        std::move(landed)(std::move(started));
      }
    };
  } else {
    // No partial read at byte offsets (the plugin lacks it, or its layout is not the dense
    // row-major one the offsets mean): the whole buffer through ToHostBuffer, waited for on the
    // worker, then the range copied out of it there.
    read = [rank = parts.dims.size(), total = source.size_bytes, offset_bytes, size_bytes, dst,
            row_major = platform.row_major_layouts,
            what = what + " (a whole read)"](const PjrtBufferHandle& handle, OnLanded landed) {
      std::move(landed)([&]() -> Status {
        FERRY_ASSIGN_OR_RETURN(HostTensor whole, HostTensor::Allocate(DType::kU8, {total}));
        FERRY_RETURN_IF_ERROR(
            ReadDenseThroughPlugin(handle, rank, whole.data(), total, !row_major, what));
        std::memcpy(dst, whole.data() + offset_bytes, static_cast<size_t>(size_bytes));
        return OkStatus();
      }());
    };
  }
  Promise<> done;
  Status queued = source.device->RunOnStagingWorker(
      StagingDirection::kDeviceToHost, [handle = parts.handle, read = std::move(read), done,
                                        token = std::move(token)](Status start) mutable {
        // `finish` holds the buffer's only reference here, and lets go of it before the read is
        // reported done (also when the event runs it inline, inside `read`, which touches the
        // buffer no more after the plugin has the read).
        const PjrtBufferHandle* buffer = handle.get();
        OnLanded finish = [handle = std::move(handle), done,
                           token = std::move(token)](Status status) mutable {
          handle.reset();
          done.Set(std::move(status));
          token.Release();
        };
        if (!start.ok()) {
          std::move(finish)(std::move(start));
          return;
        }
        std::move(read)(*buffer, std::move(finish));
      });
  if (!queued.ok()) return Future<>::Ready(std::move(queued));
  return done.future();
}

StatusOr<std::unique_ptr<Buffer>> PjrtBuffer::CopyToDevice(Device* target) {
  PjrtClient* client = source_.client;
  FERRY_ASSIGN_OR_RETURN(
      ClientLifetime::Token token,
      ClientLifetime::Begin(lifetime_, fmt::format("CopyToDevice from {}", device_name_)));
  const auto devices = client->devices();
  const bool same_client =
      target != nullptr && std::find(devices.begin(), devices.end(), target) != devices.end();
  const PjrtLibrary& library = client->runtime()->library();
  // A view buffer of ferry's own memory (the direct path) is copied through ferry's kernels:
  // the plugin would allocate fresh memory for it, the slow case the direct path exists for.
  if (!same_client || !FERRY_PJRT_HAS(library, PJRT_Buffer_CopyToDevice) ||
      client->platform().direct_host_access) {
    token.Release();
    return Buffer::CopyToDevice(target);
  }
  auto* pjrt_target = static_cast<PjrtDevice*>(target);
  // A buffer still being filled (a put, a writer) is not ready in the plugin either, and the
  // plugin orders its copy after the fill, so the call returns without waiting for it. Not where
  // a failed fill cannot fail the plugin's buffer (no SetBufferError): its copy would never
  // complete, so the call waits and reports the fill's error instead.
  const bool plugin_fails_unfilled_buffers =
      FERRY_PJRT_HAS(library, PJRT_AsyncHostToDeviceTransferManager_SetBufferError);
  if (!plugin_fails_unfilled_buffers || parts_.ready.IsReady()) {
    FERRY_RETURN_IF_ERROR(parts_.ready.Await());
  }
  FERRY_RETURN_IF_ERROR(pjrt_target->memory()->Reserve(size_bytes_, "copy", pjrt_target->name()));
  auto accounted = std::make_shared<AccountedBytes>(pjrt_target->memory(), size_bytes_);
  const PJRT_Api& api = client->runtime()->api();
  auto args = FERRY_PJRT_ARGS(PJRT_Buffer_CopyToDevice_Args);
  args.buffer = parts_.handle->get();
  args.dst_device = pjrt_target->pjrt_device();
  FERRY_RETURN_IF_ERROR(client->runtime()->Check(
      api.PJRT_Buffer_CopyToDevice(&args),
      fmt::format("CopyToDevice from {} to {}", device_name_, target->name())));
  PjrtBufferParts parts;
  parts.handle = std::make_shared<PjrtBufferHandle>(client->runtime(), args.dst_buffer);
  parts.device_dtype = parts_.device_dtype;
  parts.dims = parts_.dims;
  parts.memory_keepalive = accounted;
  auto ready_args = FERRY_PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args);
  ready_args.buffer = args.dst_buffer;
  FERRY_RETURN_IF_ERROR(
      client->runtime()->Check(api.PJRT_Buffer_ReadyEvent(&ready_args), "Buffer_ReadyEvent"));
  Promise<> ready;
  parts.ready = ready.future();
  // The copy holds the source buffer until it has arrived: the plugin may read it after the call
  // (asynchronously), and nothing in the C API says a source destroyed meanwhile stays readable
  // (a source that aliases the caller's memory gives it back when it is destroyed).
  OnEventReady(
      api, ready_args.event,
      [ready, source = parts_.handle, token = std::move(token)](Status status) mutable {
        source.reset();
        ready.Set(std::move(status));  // before the token: the client waits for both
        token.Release();
      },
      fmt::format("CopyToDevice to {}", target->name()));
  return std::unique_ptr<Buffer>(new PjrtBuffer(pjrt_target, std::move(parts)));
}

// One ToHost in flight. It holds what the read needs (the buffer's handle and its accounted
// memory, through the source) and a client token; every piece of the read that outlives its
// call holds it. Its future completes when the last piece lets go, after the source is dropped:
// whoever destroys the buffer once the read's future is done finds its bytes out of
// bytes_in_use at once, not when some worker's closure happens to be destroyed.
class PjrtBuffer::Read {
 public:
  Read(const ReadSource& source, const MutableHostView& dst, Promise<> done,
       ClientLifetime::Token token)
      : source_(source), dst_(dst), done_(std::move(done)), token_(std::move(token)) {}
  Read(const Read&) = delete;
  Read& operator=(const Read&) = delete;

  ~Read() {
    Status status;
    {
      MutexLock lock(mutex_);
      status = finished_ ? std::move(status_)
                         : AbortedError(fmt::format("ToHost from {}: the read was dropped before "
                                                    "it finished (the client is shutting down)",
                                                    source_->device_name));
    }
    source_.reset();  // the buffer's memory first, then the future, then the client
    done_.Set(std::move(status));
    token_.Release();
  }

  const ReadSource& source() const { return *source_; }
  const MutableHostView& dst() const { return dst_; }
  // The client's token, taken once the data has arrived (the read uses the client from then on).
  void HoldClient(ClientLifetime::Token token) { token_ = std::move(token); }

  // The read's outcome, reported when the last piece lets go; an error outranks OK.
  void Finish(Status status) {
    MutexLock lock(mutex_);
    if (!finished_ || (status_.ok() && !status.ok())) status_ = std::move(status);
    finished_ = true;
  }

 private:
  std::optional<ReadSource> source_;
  const MutableHostView dst_;
  Promise<> done_;
  ClientLifetime::Token token_;
  Mutex mutex_;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
  Status status_ ABSL_GUARDED_BY(mutex_);
};

Future<> PjrtBuffer::ToHost(const MutableHostView& dst) {
  if (Status status = CheckToHostArgs(parts_.dims, parts_.device_dtype, dst); !status.ok()) {
    return Future<>::Ready(std::move(status));
  }
  std::string what = fmt::format("ToHost from {}", device_name_);
  if (Status open = ClientLifetime::Begin(lifetime_, what).status(); !open.ok()) {
    return Future<>::Ready(open);  // refused at once on a closed client
  }
  Promise<> done;
  Future<> result = done.future();
  // The read starts once the data has arrived: at once, on this thread, when it has; else on the
  // thread that completes Ready() (a plugin or engine thread: StartRead hands whatever may wait to
  // the staging worker). The read holds the buffer's handle, so the device memory (or an alias's
  // source, released at PJRT_Buffer_Destroy) outlives it even if the buffer is destroyed first.
  // It holds the client (its token) only from then on: while it waits for a BufferWriter's fill,
  // the client may be destroyed (before, its destructor waited for this read, which waited for a
  // writer destroyed after the client: a hang); it then fails with FailedPrecondition.
  auto read = std::make_shared<Read>(source_, dst, std::move(done), ClientLifetime::Token());
  parts_.ready.OnReady(
      [read = std::move(read), lifetime = lifetime_, what = std::move(what)](const Status& ready) {
        Status started = ready;
        if (started.ok()) {
          StatusOr<ClientLifetime::Token> token = ClientLifetime::Begin(lifetime, what);
          if (token.ok()) {
            read->HoldClient(*std::move(token));
            started = StartRead(read, /*on_worker=*/false);
          } else {
            started = token.status();
          }
        }
        if (!started.ok()) read->Finish(std::move(started));
      });
  return result;
}

namespace {

// The whole buffer into a dense temporary in the device dtype (ToHostBuffer, a row-major
// host_layout asked for when `ask_row_major`), then converted into `dst` on this thread.
Status ReadThroughDenseTemporary(const PjrtBuffer::ReadSource& source, const MutableHostView& dst,
                                 bool ask_row_major) {
  const PjrtBufferParts& parts = source.parts;
  FERRY_ASSIGN_OR_RETURN(HostTensor whole, HostTensor::Allocate(parts.device_dtype, parts.dims));
  FERRY_RETURN_IF_ERROR(ReadDenseThroughPlugin(
      *parts.handle, parts.dims.size(), whole.data(), source.size_bytes, ask_row_major,
      fmt::format("ToHostBuffer from {}", source.device_name)));
  FERRY_ASSIGN_OR_RETURN(CopyConvertPlan plan, CopyConvertPlan::Create(whole.view(), dst));
  plan.CopyAll();
  return OkStatus();
}

// Partial reads (CopyRawToHost) into the device's device-to-host staging ring, started here (the
// device's staging worker) chunk by chunk; each chunk is converted into `dst` where its event
// completes (the plugin's thread: CPU work that never waits, so a landing never needs this
// worker, which may be waiting in the ring for the chunk that landing returns). `finished` runs
// once every chunk has landed, with the first error. Returns once every chunk is handed to the
// plugin, with the error that stopped handing them out (`finished` still runs).
Status StartStagedChunkReads(const PjrtBuffer::ReadSource& source, const MutableHostView& dst,
                             absl::AnyInvocable<void(Status) &&> finished) {
  PjrtBufferHandle& handle = *source.parts.handle;
  const std::string raw_what = fmt::format("CopyRawToHost from {}", source.device_name);
  auto counter = std::make_shared<PieceCounter>(std::move(finished));
  Status started = StagedRead(
      source.device->staging(StagingDirection::kDeviceToHost), source.parts.device_dtype, dst,
      [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone landed) -> Status {
        return StartRawReadThroughPlugin(handle, piece.offset_bytes, piece.size_bytes, chunk.host,
                                         raw_what, landed);
      },
      counter);
  counter->Done(started);
  return started;
}

}  // namespace

Status PjrtBuffer::StartRead(const std::shared_ptr<Read>& read, bool on_worker) {
  // The read's token keeps the client (its engine and staging) alive until the read is over.
  const ReadSource& source = read->source();
  const MutableHostView& dst = read->dst();
  const PjrtBufferParts& parts_ = source.parts;
  const std::string& device_name_ = source.device_name;
  const int64_t size_bytes_ = source.size_bytes;
  PjrtClient* const client_ = source.client;
  if (dst.num_elements() == 0) {
    read->Finish(OkStatus());
    return OkStatus();
  }
  const DType device_dtype = parts_.device_dtype;
  PjrtBufferHandle& handle = *parts_.handle;

  if (parts_.host_address != nullptr) {
    FERRY_ASSIGN_OR_RETURN(
        CopyConvertPlan plan,
        CopyConvertPlan::Create(HostView::Dense(parts_.host_address, device_dtype, parts_.dims),
                                dst));
    if (size_bytes_ <= kInlineReadBytes) {
      plan.CopyAll();
      read->Finish(OkStatus());
      return OkStatus();
    }
    return client_->engine()->Submit(std::move(plan), [read = read](Status status) mutable {
      read->Finish(std::move(status));
      read.reset();
    });
  }

  // Every read through the plugin starts on the device's device-to-host staging worker: one
  // stream of reads per device, in order. A dense read in the device dtype is then finished by the
  // plugin's event, a read converted on the host by its chunks' events (each chunk converted
  // where it lands), and the worker goes on to the next read; only a whole read through a dense
  // temporary (no partial reads) waits on the worker for its bytes. The plugins here write a read's
  // bytes before they run its event's callbacks (0 of 3,200 partial and 0 of 3,600 other reads
  // otherwise, 2026-12-05; tests/plugin holds it): continuations may take the bytes.
  if (!on_worker) {
    return source.device->RunOnStagingWorker(StagingDirection::kDeviceToHost,
                                             [read = read](Status start) mutable {
                                               if (start.ok())
                                                 start = StartRead(read, /*on_worker=*/true);
                                               if (!start.ok()) read->Finish(std::move(start));
                                               read.reset();
                                             });
  }
  const bool dense_same_dtype = dst.dtype == device_dtype && dst.IsRowMajorDense();
  const PjrtPlatformInfo& platform = client_->platform();
  const std::string what = fmt::format("ToHostBuffer from {}", device_name_);
  if (dense_same_dtype) {
    // Started here, finished by the plugin's event: the worker does not wait for it.
    StartDenseReadThroughPlugin(handle, parts_.dims.size(), dst.data, size_bytes_,
                                !platform.row_major_layouts, what,
                                [read = std::shared_ptr<Read>(read)](Status status) mutable {
                                  read->Finish(std::move(status));
                                  read.reset();
                                });
    return OkStatus();
  }
  if (!platform.reads_at_byte_offsets()) {
    // No partial reads at byte offsets (see CopyRawToHost).
    read->Finish(ReadThroughDenseTemporary(source, dst, !platform.row_major_layouts));
    return OkStatus();
  }
  // The chunks' events finish the read; the worker goes on once every chunk is handed out.
  StartStagedChunkReads(source, dst, [read = std::shared_ptr<Read>(read)](Status status) mutable {
    read->Finish(std::move(status));
    read.reset();
  }).IgnoreError();  // (the error also reaches `finished`)
  return OkStatus();
}

}  // namespace ferry::pjrt
