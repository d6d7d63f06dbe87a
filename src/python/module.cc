// The `ferry._ferry` extension module: the C++ side of the Python API (the package in
// python/ferry holds the Python side). Every entry point drains the release queue (gil.h, defence
// 2) and every call that can wait releases the GIL (defence 1).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "ferry/device/registry.h"
#include "ferry/distributed/global_devices.h"
#include "ferry/io/mapped_file.h"
#include "ferry/runtime/file_load.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "ferry/version.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/python/distributed.h"
#include "src/python/gil.h"
#include "src/python/numpy_arrays.h"
#include "src/python/py_source.h"
#include "src/python/status_error.h"
#include "src/python/tensor_files.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// absl::StatusCode -> Python exception class, filled by ferry/_errors.py at import.
std::map<int, PyObject*>& ErrorClasses() {
  static auto* classes = new std::map<int, PyObject*>();
  return *classes;
}

// Backends' clients, created on first use and kept for the life of the process (destroying them
// at interpreter exit would race with finalisation; the OS reclaims everything).
//
// After fork() the child has none of its parent's backend threads: a registry belongs to one
// fork generation (gil.h), and a child abandons its parent's (never destroyed, never waited on)
// and starts its own. The host backend is simply made again in the child. A backend that
// wraps a vendor runtime (OpenCL) cannot be: the runtime's own threads and state did not survive
// the fork, so such a backend, once started before a fork, is refused in the child with an error
// that says so (instead of a hang in the vendor's library).
struct ClientRegistry {
  explicit ClientRegistry(uint64_t generation) : generation(generation) {}
  const uint64_t generation;
  Mutex mutex;
  std::map<std::string, std::unique_ptr<Client>, std::less<>> clients ABSL_GUARDED_BY(mutex);
  // Started before a fork in an ancestor.
  std::set<std::string, std::less<>> inherited ABSL_GUARDED_BY(mutex);
};

// Backends started in this process or an ancestor, for the child to know what it inherited.
// Written only with the registry's mutex held, read by a fork child after the fork (no other
// thread exists then): a fixed array of flags, so that a fork in the middle of an update never
// leaves a half-built container behind.
constexpr size_t kMaxBackends = 16;
std::array<std::atomic<bool>, kMaxBackends> started_backends{};

size_t BackendSlot(std::string_view backend) {
  const std::vector<std::string> names = RegisteredBackends();
  for (size_t i = 0; i < names.size() && i < kMaxBackends; ++i) {
    if (names[i] == backend) return i;
  }
  return kMaxBackends;
}

ClientRegistry& Registry() {
  static std::atomic<ClientRegistry*> current{new ClientRegistry(0)};
  ClientRegistry* registry = current.load(std::memory_order_acquire);
  const uint64_t generation = ForkGeneration();
  while (registry->generation != generation) {
    auto* fresh = new ClientRegistry(generation);
    const std::vector<std::string> names = RegisteredBackends();
    for (size_t i = 0; i < names.size() && i < kMaxBackends; ++i) {
      if (started_backends[i].load() && names[i] != "host") fresh->inherited.insert(names[i]);
    }
    if (current.compare_exchange_strong(registry, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;
  }
  return *registry;
}

// Requires the GIL; releases it while it waits for the registry's mutex and while it creates a
// client (which can take long and wait for a vendor runtime): a thread never holds both the GIL
// and the mutex, so neither can wait on the other.
Client* GetClient(const std::string& backend) {
  ClientRegistry& registry = Registry();
  ScopedGilRelease unlocked;
  MutexLock lock(registry.mutex);
  auto it = registry.clients.find(backend);
  if (it == registry.clients.end()) {
    if (registry.inherited.contains(backend)) {
      throw StatusError{FailedPreconditionError(fmt::format(
          "the {} backend was started before this process was forked, and its runtime does not "
          "survive fork(): use it in a process started with the 'spawn' or 'forkserver' method, "
          "or start it only after the fork",
          backend))};
    }
    std::unique_ptr<Client> client = ValueOrThrow(CreateClient(backend));
    if (const size_t slot = BackendSlot(backend); slot < kMaxBackends) {
      started_backends[slot].store(true);
    }
    it = registry.clients.emplace(backend, std::move(client)).first;
  }
  return it->second.get();
}

// Raises FailedPrecondition unless `device` belongs to a client of this process (not one
// abandoned at a fork).
void CheckDeviceUsable(const Device* device) {
  if (device == nullptr) return;
  if (!device->is_addressable()) {
    throw StatusError{FailedPreconditionError(fmt::format(
        "device {} of process {} is not this process's: a process puts to and reads from its own "
        "devices only (a Sharding over a mesh that holds it sends this process's shards)",
        device->name(), static_cast<const distributed::RemoteDevice*>(device)->process_index()))};
  }
  ClientRegistry& registry = Registry();
  ScopedGilRelease unlocked;  // as in GetClient: never the GIL and the mutex at once
  MutexLock lock(registry.mutex);
  for (const auto& [name, client] : registry.clients) {
    if (client.get() == device->client()) return;
  }
  throw StatusError{FailedPreconditionError(
      fmt::format("device {} was opened before this process was forked; a forked child must "
                  "look its devices up again (ferry.device(\"{}\"))",
                  device->name(), device->name()))};
}

// Raises the first error a handle's source reported once read (DataLoss naming the file when a
// mapped file was truncated under the read: what was read there is zeros), among the handles
// whose source has been read already (all of them after a "copy" put). Each handle answers for its
// own source only; one still being read answers when it is ready (Array.block_until_ready, reads).
void CheckSourcesRead(absl::Span<const DataPtr> handles) {
  for (const DataPtr& handle : handles) {
    if (handle == nullptr) continue;
    if (const Future<> read = handle->SourceRead(); read.IsReady()) ThrowIfError(read.Await());
  }
}

// "copy" puts whose sources of kLongCopySourceBytes or more add up to at least this many bytes
// wait interruptibly (see PutEach). Smaller sources are copied during the call, a batch of them
// on every core (transfer.h), a few microseconds each: turning them into asynchronous transfers
// to wait for made a batch of 16,384 arrays of 4 KiB cost 7 us an array against 4 us for the
// same arrays put one call at a time.
constexpr int64_t kInterruptiblePutBytes = int64_t{32} << 20;
constexpr int64_t kLongCopySourceBytes = int64_t{1} << 20;

// Waits (interruptibly: Ctrl-C raises KeyboardInterrupt) until every handle is ready.
void WaitForAll(const std::vector<DataPtr>& handles) {
  std::vector<Future<>> ready;
  ready.reserve(handles.size());
  for (const DataPtr& handle : handles) ready.push_back(handle->Ready());
  WaitInterruptibly(JoinFutures(ready));
}

// A "copy" put whose sources of at least kLongCopySourceBytes add up to `long_copy_bytes`: when
// that reaches kInterruptiblePutBytes, it becomes an asynchronous put (`options` changed) that the
// caller then waits for with WaitForAll, interruptibly; true then.
bool MakeInterruptible(TransferToDeviceOptions& options, int64_t long_copy_bytes) {
  if (options.semantics != HostBufferSemantics::kImmutableOnlyDuringCall ||
      long_copy_bytes < kInterruptiblePutBytes) {
    return false;
  }
  options.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  return true;
}

// The sum of the sizes of `sources` of at least kLongCopySourceBytes (null ones skipped).
int64_t LongCopyBytes(const std::vector<std::shared_ptr<const TensorSource>>& sources) {
  int64_t total = 0;
  for (const auto& source : sources) {
    if (source == nullptr) continue;
    const int64_t bytes = source->view().dense_size_bytes();
    if (bytes >= kLongCopySourceBytes) total += bytes;
  }
  return total;
}

// This process's shards of `sharded` (other processes' are null there).
std::vector<DataPtr> OwnShards(const ShardedDataPtr& sharded) {
  std::vector<DataPtr> own;
  for (const DataPtr& shard : sharded->shards()) {
    if (shard != nullptr) own.push_back(shard);
  }
  return own;
}

constexpr std::string_view kForkedArray =
    "the array was made before this process was forked, and ferry's devices do not survive "
    "fork(): put the data again in the child";

Device* DeviceByName(const std::string& name) {
  const size_t colon = name.find(':');
  const std::string backend = colon == std::string::npos ? name : name.substr(0, colon);
  Client* client = GetClient(backend);
  int index = 0;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      index = std::stoi(name.substr(colon + 1), &used);
      if (used != name.size() - colon - 1) throw std::invalid_argument(name);
    } catch (const std::exception&) {
      throw StatusError{InvalidArgumentError(
          fmt::format("device name '{}' is not of the form backend:index", name))};
    }
  }
  auto devices = client->devices();
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    const std::string hint = DeviceCountHint(backend);
    throw StatusError{absl::NotFoundError(
        fmt::format("device '{}' does not exist: backend {} has {} device(s){}", name, backend,
                    devices.size(), hint.empty() ? "" : "; " + hint))};
  }
  return devices[index];
}

DType ParseDType(const std::string& name) { return ValueOrThrow(DTypeFromName(name)); }

HostBufferSemantics ParseSemantics(const std::string& semantics) {
  if (semantics == "copy") return HostBufferSemantics::kImmutableOnlyDuringCall;
  if (semantics == "async") return HostBufferSemantics::kImmutableUntilTransferCompletes;
  if (semantics == "zero_copy") return HostBufferSemantics::kImmutableZeroCopy;
  throw StatusError{InvalidArgumentError(
      fmt::format("semantics must be 'copy', 'async' or 'zero_copy', got '{}'", semantics))};
}

// A function of the `ferry` package (python/ferry/_arrays.py): the Array methods written in
// Python are defined on the class here and call it. The package is imported once and held for
// good (never released: the interpreter may be gone by the time static destructors run), so
// that a method called while the interpreter finalises (a __del__ at exit, after sys.modules was
// emptied: import then fails) still finds it.
std::atomic<PyObject*> held_package{nullptr};

void HoldPackage(nb::handle package) {
  PyObject* expected = nullptr;
  if (held_package.compare_exchange_strong(expected, package.ptr())) Py_INCREF(package.ptr());
}

nb::object PythonHelper(const char* name) {
  if (held_package.load() == nullptr) HoldPackage(nb::module_::import_("ferry"));
  return nb::borrow(held_package.load()).attr(name);
}

// copy_to_host_async(): reads started ahead of to_numpy(), into a tensor in the logical dtype.
// The reads hold this state (and so the tensor) until the last one has finished, even if the
// array is gone by then.
struct HostCopy {
  HostTensor tensor;
  Future<> done;
};

// A Data handle held by a numpy view of the array's memory. In a forked child it is let go of
// without its destructor, which may wait for the parent's engine threads (as Array::Abandon).
struct ForkSafeDataRef {
  explicit ForkSafeDataRef(DataPtr data_ref) : data(std::move(data_ref)) {}
  ForkSafeDataRef(const ForkSafeDataRef&) = delete;
  ForkSafeDataRef& operator=(const ForkSafeDataRef&) = delete;
  ~ForkSafeDataRef() {
    if (generation != ForkGeneration()) new DataPtr(std::move(data));
  }
  DataPtr data;
  uint64_t generation = ForkGeneration();
};

// A device array: one Data handle, or a tensor sharded over a mesh.
class Array {
 public:
  explicit Array(DataPtr data) : data_(std::move(data)) {}
  explicit Array(ShardedDataPtr sharded) : sharded_(std::move(sharded)) {}
  Array(const Array&) = default;
  Array(Array&&) = default;
  Array& operator=(const Array&) = default;
  Array& operator=(Array&&) = default;
  ~Array() {
    if (generation_ != ForkGeneration()) Abandon();
  }

  bool is_deleted() const { return data_ == nullptr && sharded_ == nullptr; }
  void CheckAlive() const {
    if (is_deleted()) throw StatusError{FailedPreconditionError("the array has been deleted")};
    if (generation_ != ForkGeneration()) {
      throw StatusError{FailedPreconditionError(std::string(kForkedArray))};
    }
  }
  // The single handle of an unsharded array (this process's first shard's, for a sharded one).
  const DataPtr& data() const {
    CheckAlive();
    if (!sharded_) return data_;
    for (const DataPtr& shard : sharded_->shards()) {
      if (shard != nullptr) return shard;
    }
    throw StatusError{FailedPreconditionError(
        "the array has no shard on this process's devices (its mesh holds only other "
        "processes' devices here)")};
  }
  const ShardedDataPtr& sharded() const { return sharded_; }
  // Every Data handle of this process: one, or one per mesh device of this process.
  std::vector<DataPtr> handles() const {
    CheckAlive();
    return sharded_ ? sharded_->addressable_shards() : std::vector<DataPtr>{data_};
  }
  // The memory space the data lives in (every shard's: one put places them all alike).
  std::string memory_kind() const {
    const std::vector<DataPtr> local = handles();
    return local.empty() ? std::string("device") : local.front()->buffer().memory_kind();
  }
  bool is_fully_addressable() const {
    CheckAlive();
    return !sharded_ || sharded_->is_fully_addressable();
  }

  nb::tuple shape() const {
    CheckAlive();
    nb::list dims;
    for (int64_t dim : sharded_ ? sharded_->global_dims() : data_->dims()) dims.append(dim);
    return nb::tuple(dims);
  }
  std::string dtype_name() const {
    CheckAlive();
    return std::string(DTypeName(sharded_ ? sharded_->logical_dtype() : data_->logical_dtype()));
  }
  std::string device_dtype() const { return std::string(DTypeName(data()->device_dtype())); }
  // Each shard's device dtype (one entry for an unsharded array), in mesh order.
  std::vector<std::string> shard_device_dtypes() const {
    std::vector<std::string> names;
    for (const DataPtr& handle : handles()) names.emplace_back(DTypeName(handle->device_dtype()));
    return names;
  }
  const Dims& dims() const {
    CheckAlive();
    return sharded_ ? sharded_->global_dims() : data_->dims();
  }
  int64_t size() const { return SaturatedNumElements(dims()); }
  // Bytes of the logical (source) dtype: what to_numpy() returns, as numpy's nbytes.
  int64_t nbytes() const {
    return size() * DTypeSize(sharded_ ? sharded_->logical_dtype() : data_->logical_dtype());
  }
  int64_t length() const {
    if (dims().empty()) {
      PyErr_SetString(PyExc_TypeError, "len() of a 0-d ferry.Array");
      throw nb::python_error();
    }
    return dims()[0];
  }
  Device* device() const { return data()->device(); }
  // One device, or every mesh device in mesh order: other processes' too (as JAX's
  // Array.devices()), which a shard list (handles()) leaves out.
  std::vector<Device*> devices() const {
    CheckAlive();
    if (sharded_ != nullptr) return sharded_->sharding().mesh().devices();
    return {data_->device()};
  }
  bool is_ready() const {
    // Drains the release queue on the way out too: a thread that polls is_ready() while the main
    // thread is blocked outside Python (no pending call runs there) finds the source released
    // once it sees True.
    ApiScope api;
    for (const DataPtr& handle : handles()) {
      if (!handle->Ready().IsReady()) return false;
    }
    return true;
  }
  void block_until_ready() const {
    ApiScope api;
    std::vector<DataPtr> all = handles();
    WaitForAll(all);
    Status status = AwaitReady(all);  // every handle is ready: this only collects the status
    // A source truncated under the read fails its handle's Ready() (DataLoss): in `status`.
    ThrowIfError(status);
  }
  // Appends the reads of the whole array into `dst` (the array's dims; each distinct shard once,
  // into its part of `dst`) to `handles` and `views`, for TransferFromDeviceInto. `what` names the
  // call in errors.
  void AppendReads(const MutableHostView& dst, std::string_view what, std::vector<DataPtr>* handles,
                   std::vector<MutableHostView>* views) const {
    CheckAlive();
    if (sharded_ != nullptr) {
      // Across processes the whole array reads here when every part has a replica here (a
      // replicated tensor, or one split only within each process), as device_get(a) reads it.
      if (Status here = CheckAssemblableHere(*sharded_); !here.ok()) {
        throw StatusError{FailedPreconditionError(
            fmt::format("{}: {}; read this process's part with local_shards()", what,
                        std::string(here.message())))};
      }
    }
    if (dst.dims != dims()) {
      throw StatusError{InvalidArgumentError(
          fmt::format("{}: the destination's dims [{}] differ from the array's [{}]", what,
                      fmt::join(dst.dims, ", "), fmt::join(dims(), ", ")))};
    }
    if (!sharded_) {
      handles->push_back(data_);
      views->push_back(dst);
      return;
    }
    std::vector<ShardIndex> started;
    for (size_t i = 0; i < sharded_->shards().size(); ++i) {
      const DataPtr& shard = sharded_->shards()[i];
      const ShardIndex& index = sharded_->indices()[i];
      if (shard == nullptr || std::find(started.begin(), started.end(), index) != started.end()) {
        continue;  // another process's shard, or a replica of one already read
      }
      started.push_back(index);
      handles->push_back(shard);
      views->push_back(SubView(dst, index));
    }
  }
  // Starts reading the whole array into host memory (each distinct shard once) and returns at
  // once; a no-op when a copy is already under way.
  void StartHostCopy() {
    CheckAlive();
    if (host_copy_ != nullptr) return;
    auto copy = std::make_shared<HostCopy>();
    const DType logical = sharded_ ? sharded_->logical_dtype() : data_->logical_dtype();
    copy->tensor = ValueOrThrow(HostTensor::Allocate(logical, dims()));
    std::vector<DataPtr> handles;
    std::vector<MutableHostView> views;
    AppendReads(copy->tensor.mutable_view(), "copy_to_host_async", &handles, &views);
    copy->done = TransferFromDeviceInto(handles, views);
    copy->done.OnReady([copy](const Status&) {});  // keeps the tensor until the reads are over
    host_copy_ = std::move(copy);
  }
  // Another Array over the same device data (from_dlpack of an Array): no copy; each Array's
  // delete() drops only its own reference.
  Array Alias() const {
    CheckAlive();
    Array alias = sharded_ ? Array(sharded_) : Array(data_);
    alias.read_only_alias_ = read_only_alias_;
    return alias;
  }
  // The copy started by StartHostCopy, handed over (nullptr when none was started).
  std::shared_ptr<HostCopy> TakeHostCopy() { return std::move(host_copy_); }
  void Delete() {
    if (generation_ != ForkGeneration()) Abandon();
    data_.reset();
    sharded_.reset();
    host_copy_.reset();  // its reads hold it until they are over (StartHostCopy)
  }
  // Where the device data is, as DLPack numbers devices: (kDLCPU = 1, 0) for host-addressable
  // memory, (kDLCUDA = 2 or kDLROCM = 10, ordinal) for a GPU plugin's memory
  // (Buffer::DataAddress). Unimplemented for memory without an address (opencl, TPU).
  std::pair<int32_t, int32_t> DLPackDevice() const {
    if (sharded_) {
      throw StatusError{UnimplementedError("DLPack export of a sharded array: use local_shards()")};
    }
    const BufferAddress address = ValueOrThrow(data()->buffer().DataAddress());
    return {static_cast<int32_t>(address.space), address.device_ordinal};
  }
  // The device data as a DLPack capsule, keeping the array's data alive. `max_version_major` >= 1:
  // the consumer takes versioned capsules, which can say READ_ONLY. Zero-copy, except over
  // read-only host memory (an alias of a read-only source): that is copied unless the consumer
  // insists on no copy (`copy=False`) and takes a versioned capsule, which then carries
  // READ_ONLY. Some consumers that ask for versioned capsules ignore the flag (torch 2.13 makes a
  // writable tensor of it), so without that insistence a copy is the only export that cannot be
  // written through. Device memory (a GPU plugin's) is exported as it is, once the transfer that
  // filled it has completed (so any stream of the consumer sees it); a copy of it is refused.
  nb::object ExportDLPack(int max_version_major, std::optional<bool> copy) const {
    if (sharded_) {
      throw StatusError{UnimplementedError("DLPack export of a sharded array: use local_shards()")};
    }
    DataPtr data_ref = data();
    block_until_ready();
    const Buffer& buffer = data_ref->buffer();
    const BufferAddress address = ValueOrThrow(buffer.DataAddress());
    const HostView view = HostView::Dense(address.data, buffer.device_dtype(), buffer.dims());
    DLPackExport how;
    how.versioned = max_version_major >= 1;
    how.device_type = static_cast<int32_t>(address.space);
    how.device_id = address.device_ordinal;
    if (address.space != AddressSpace::kHost) {
      if (copy.value_or(false)) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__(copy=True): ferry exports device memory as it is; read it "
                        "with to_numpy() for a copy");
        throw nb::python_error();
      }
      return DLPackCapsule(view, std::shared_ptr<const void>(data_ref), how);
    }
    // Only an alias of read-only memory is read-only; the device's own memory is the array's.
    how.read_only = read_only_alias_ && buffer.is_alias();
    const bool must_copy = copy.value_or(how.read_only);
    if (!must_copy) {
      if (how.read_only && !how.versioned) {
        PyErr_SetString(PyExc_BufferError,
                        "__dlpack__(copy=False): the array aliases read-only memory, which an "
                        "unversioned DLPack capsule cannot mark read-only; pass max_version=(1, 0) "
                        "or allow a copy");
        throw nb::python_error();
      }
      return DLPackCapsule(view, std::shared_ptr<const void>(data_ref), how);
    }
    auto copied =
        std::make_shared<HostTensor>(ValueOrThrow(HostTensor::Allocate(view.dtype, view.dims)));
    {
      ScopedGilRelease unlocked(view.dense_size_bytes() > (int64_t{256} << 10));
      ThrowIfError(CopyConvert(view, copied->mutable_view()));
    }
    how.read_only = false;  // the copy is the consumer's
    how.copied = true;
    HostView copied_view = copied->view();
    return DLPackCapsule(copied_view, std::shared_ptr<const void>(copied), how);
  }
  void set_read_only_alias(bool read_only) { read_only_alias_ = read_only; }

  // (numpy array, "") where numpy can read the data where it lies: an unsharded array, stored in
  // its own (logical) dtype, in memory the host addresses (the host device; a pjrt CPU plugin's).
  // The numpy array is read-only (an Array is immutable) and holds the Data handle, so the memory
  // stays valid while it or any view of it lives, whatever happens to this Array: delete() drops
  // only the Array's own reference. Waits for the transfer into the array first. Otherwise
  // (None, why not), for numpy's copy=False error.
  // A read-only numpy view of the array's device memory (host-addressable memory only), or None
  // and the reason. `stored`: the bytes as the device stores them (its device dtype, bfloat16
  // and float8 as unsigned ints of their size) even where that is not the logical dtype.
  nb::tuple NumpyView(bool stored) const {
    if (sharded_) {
      return nb::make_tuple(nb::none(),
                            "it is sharded, and numpy needs the shards assembled into one copy");
    }
    DataPtr data_ref = data();
    if (!stored && data_ref->device_dtype() != data_ref->logical_dtype()) {
      return nb::make_tuple(nb::none(), fmt::format("the device stores it as {}, not as its {}",
                                                    DTypeName(data_ref->device_dtype()),
                                                    DTypeName(data_ref->logical_dtype())));
    }
    const StatusOr<BufferAddress> address = data_ref->buffer().DataAddress();
    if (!address.ok() || address->space != AddressSpace::kHost) {
      return nb::make_tuple(nb::none(), fmt::format("its memory on {} is not host memory",
                                                    data_ref->device()->name()));
    }
    block_until_ready();
    const HostView view =
        HostView::Dense(address->data, data_ref->device_dtype(), data_ref->buffer().dims());
    return nb::make_tuple(
        ReadOnlyNumpyView(view, std::make_shared<const ForkSafeDataRef>(data_ref), "array"), "");
  }

 private:
  // In a forked child, the parent's handles are let go of without their destructors, which may
  // wait for the parent's engine threads.
  void Abandon() {
    if (data_) new DataPtr(std::move(data_));
    if (sharded_) new ShardedDataPtr(std::move(sharded_));
    if (host_copy_) new std::shared_ptr<HostCopy>(std::move(host_copy_));
  }

  DataPtr data_;
  ShardedDataPtr sharded_;
  uint64_t generation_ = ForkGeneration();
  bool read_only_alias_ = false;         // made with zero_copy from read-only memory
  std::shared_ptr<HostCopy> host_copy_;  // copy_to_host_async()'s reads, until to_numpy()
};

nb::list IndexToPython(const ShardIndex& index) {
  nb::list ranges;
  for (const DimRange& range : index) ranges.append(nb::make_tuple(range.begin, range.end));
  return ranges;
}

// (device, [(begin, end) per dim], numpy data) for every shard, in mesh order.
std::vector<nb::tuple> LocalShardsOf(const Array& array) {
  ApiScope api;
  array.CheckAlive();
  if (!array.sharded()) {
    throw StatusError{InvalidArgumentError("local_shards: the array is not sharded")};
  }
  ShardedDataPtr sharded = array.sharded();
  StatusOr<std::vector<LocalShard>> shards;
  {
    ScopedGilRelease unlocked;
    shards = LocalShards(*sharded);
  }
  std::vector<nb::tuple> result;
  for (LocalShard& shard : ValueOrThrow(std::move(shards))) {
    result.push_back(nb::make_tuple(nb::cast(shard.device, nb::rv_policy::reference),
                                    IndexToPython(shard.index), ToNumpy(std::move(shard.data))));
  }
  return result;
}

TransferToDeviceOptions MakeOptions(const std::string& semantics, size_t count,
                                    const std::optional<std::string>& device_dtype,
                                    const std::optional<std::string>& memory_kind = std::nullopt) {
  TransferToDeviceOptions options;
  options.semantics = ParseSemantics(semantics);
  options.memory_kind = memory_kind.value_or("");
  if (device_dtype.has_value()) options.device_dtypes.assign(count, ParseDType(*device_dtype));
  return options;
}

std::vector<std::shared_ptr<const TensorSource>> SourcesFromPython(
    const std::vector<nb::object>& objects,
    const std::vector<std::optional<std::string>>& dtype_overrides, std::string_view what,
    std::vector<bool>* read_only = nullptr, const std::vector<std::string>* names = nullptr) {
  std::vector<std::shared_ptr<const TensorSource>> sources;
  sources.reserve(objects.size());
  for (size_t i = 0; i < objects.size(); ++i) {
    std::optional<DType> override_dtype;
    if (i < dtype_overrides.size() && dtype_overrides[i].has_value()) {
      override_dtype = ParseDType(*dtype_overrides[i]);
    }
    std::string name = names != nullptr && i < names->size() ? (*names)[i]
                       : objects.size() == 1                 ? std::string(what)
                                                             : fmt::format("{} {}", what, i);
    bool source_read_only = false;
    sources.push_back(ValueOrThrow(
        SourceFromPython(objects[i], override_dtype, std::move(name), &source_read_only)));
    if (read_only != nullptr) read_only->push_back(source_read_only);
  }
  return sources;
}

// Every put releases the GIL while it runs: a "copy" put waits for its copy, and any put may wait
// for room in a backend's staging ring (sized by device bytes, which a widening conversion
// doubles) or for device memory. What a call can wait for decides, not its source's byte size.

Array PutSharded(nb::object object, std::optional<std::string> dtype_override,
                 const Sharding& sharding, std::optional<std::string> device_dtype,
                 const std::string& semantics, std::optional<std::string> memory_kind) {
  ApiScope api;
  for (const Device* device : sharding.mesh().devices()) {
    if (device->is_addressable()) CheckDeviceUsable(device);
  }
  TransferToDeviceOptions options = MakeOptions(semantics, 1, device_dtype, memory_kind);
  auto sources = SourcesFromPython({object}, {dtype_override}, "array");
  // Interruptible as PutEach's large "copy" puts.
  const bool wait_here = MakeInterruptible(options, LongCopyBytes(sources));
  StatusOr<ShardedDataPtr> data;
  {
    ScopedGilRelease unlocked;
    data = TransferShardsToDevice(std::move(sources[0]), sharding, options);
    sources.clear();
  }
  ShardedDataPtr sharded = ValueOrThrow(std::move(data));
  if (wait_here) WaitForAll(OwnShards(sharded));
  CheckSourcesRead(sharded->shards());
  return Array(std::move(sharded));
}

// `objects` holds None at the positions of other processes' devices; `dtype` names the array's
// dtype (needed where this process has no shard).
Array MakeFromShards(const std::vector<int64_t>& shape, const Sharding& sharding,
                     const std::vector<nb::object>& objects,
                     const std::vector<std::optional<std::string>>& dtype_overrides,
                     std::optional<std::string> device_dtype, const std::string& semantics,
                     std::optional<std::string> dtype) {
  ApiScope api;
  for (const Device* device : sharding.mesh().devices()) {
    if (device->is_addressable()) CheckDeviceUsable(device);
  }
  TransferToDeviceOptions options = MakeOptions(semantics, 1, device_dtype);
  std::vector<std::shared_ptr<const TensorSource>> sources(objects.size());
  for (size_t i = 0; i < objects.size(); ++i) {
    if (objects[i].is_none()) continue;  // another process's shard
    std::optional<std::string> override_dtype =
        i < dtype_overrides.size() ? dtype_overrides[i] : std::nullopt;
    sources[i] = std::move(
        SourcesFromPython({objects[i]}, {override_dtype}, fmt::format("shard {}", i)).front());
  }
  std::optional<DType> logical;
  if (dtype.has_value()) logical = ParseDType(*dtype);
  const bool wait_here = MakeInterruptible(options, LongCopyBytes(sources));
  StatusOr<ShardedDataPtr> data;
  {
    ScopedGilRelease unlocked;
    data = MakeArrayFromShards(shape, sharding, sources, options, logical);
    sources.clear();
  }
  ShardedDataPtr sharded = ValueOrThrow(std::move(data));
  if (wait_here) WaitForAll(OwnShards(sharded));
  return Array(std::move(sharded));
}

// `device_dtypes`: one entry per object (nullopt: the device's profile decides).
std::vector<Array> PutEach(const std::vector<nb::object>& objects,
                           const std::vector<std::optional<std::string>>& dtype_overrides,
                           Device* device,
                           const std::vector<std::optional<std::string>>& device_dtypes,
                           const std::string& semantics_name,
                           std::optional<std::string> memory_kind = std::nullopt,
                           std::optional<std::vector<std::string>> tensor_names = std::nullopt) {
  ApiScope api;
  if (device == nullptr) device = DeviceByName("host:0");
  CheckDeviceUsable(device);
  if (device_dtypes.size() != objects.size()) {
    throw StatusError{InvalidArgumentError(
        fmt::format("{} device dtypes for {} arrays", device_dtypes.size(), objects.size()))};
  }
  TransferToDeviceOptions options = MakeOptions(semantics_name, 0, std::nullopt, memory_kind);
  for (const std::optional<std::string>& name : device_dtypes) {
    options.device_dtypes.push_back(name.has_value() ? std::optional(ParseDType(*name))
                                                     : std::nullopt);
  }
  std::vector<bool> read_only;
  auto sources = SourcesFromPython(objects, dtype_overrides, "array", &read_only,
                                   tensor_names.has_value() ? &*tensor_names : nullptr);
  // A large "copy" put is started as an asynchronous one that this call then waits for,
  // interruptibly: Ctrl-C raises KeyboardInterrupt at once while the transfers finish in the
  // background (they hold their sources; the handles let go of the device memory when they are
  // done). Ready() completes only once a source has been released, so on return every source has
  // been read, as "copy" promises. Small puts, and batches of small arrays, stay synchronous:
  // cheaper.
  const bool wait_here = MakeInterruptible(options, LongCopyBytes(sources));
  StatusOr<std::vector<DataPtr>> data;
  {
    ScopedGilRelease unlocked;
    data = TransferToDevice(sources, device, options);
    sources.clear();  // our references go here: the transfers hold their own
  }
  std::vector<DataPtr> handles = ValueOrThrow(std::move(data));
  if (wait_here) WaitForAll(handles);
  CheckSourcesRead(handles);
  std::vector<Array> arrays;
  arrays.reserve(handles.size());
  for (size_t i = 0; i < handles.size(); ++i) {
    arrays.emplace_back(std::move(handles[i]));
    arrays.back().set_read_only_alias(read_only[i]);
  }
  return arrays;
}

// device_put's common call, without the batch's lists: one object, stored as the device's profile
// decides, in the device's default memory; the same checks, errors and semantics as PutEach.
Array PutOne(nb::object object, Device* device, const std::string& semantics_name) {
  std::vector<nb::object> objects;
  objects.push_back(std::move(object));
  std::vector<Array> arrays = PutEach(objects, {}, device, {std::nullopt}, semantics_name);
  return std::move(arrays.front());
}

// load_file(path, device): the tensors `names`, `patterns` and `exclude` select, loaded onto
// `device` (LoadFileTensors: window by window; on host:N those stored as they are kept read from
// the file straight into device memory, the others put from the mapping) as [(name, Array)] in
// file order. `device_dtype` applies to the tensors of its kind (RequestAppliesTo), to every
// tensor with `device_dtype_all`. Runs without the GIL; Ctrl-C is seen between windows.
std::vector<std::pair<nb::str, Array>> LoadFileOnto(
    const nb::bytes& path_bytes, const std::vector<nb::bytes>& names,
    const std::vector<nb::bytes>& patterns, const std::vector<nb::bytes>& exclude, Device* device,
    std::optional<std::string> device_dtype, bool device_dtype_all) {
  ApiScope api;
  const std::string path = PathFromBytes(path_bytes);
  CheckDeviceUsable(device);
  std::optional<DType> requested;
  if (device_dtype.has_value()) requested = ParseDType(*device_dtype);
  FileLoadOptions options = ValueOrThrow(FileLoadOptionsFromSettings());
  // A signal (Ctrl-C) stops the load between windows: its Python error stays set on this thread
  // and is raised once the load has returned.
  bool interrupted = false;
  options.after_window = [&interrupted] {
    // Only the main thread runs signal handlers, and only it may take the GIL back at exit (a
    // daemon thread that did, inside a load, was ended through this frame: std::terminate).
    if (!OnMainThread()) return OkStatus();
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return OkStatus();
    interrupted = true;
    return CancelledError("load_file was interrupted");
  };
  const TensorFile file = OpenSelectedTensors(
      path, StringsFromBytes(names), StringsFromBytes(patterns), StringsFromBytes(exclude));
  std::vector<FileLoadTensor> tensors;
  tensors.reserve(file.tensors().size());
  for (const TensorFileEntry& entry : file.tensors()) {
    const DType stored = entry.source->view().dtype;
    const bool applies =
        requested.has_value() && (device_dtype_all || RequestAppliesTo(*requested, stored));
    tensors.push_back(
        {&entry, file.file().get(), applies ? requested : std::nullopt, std::nullopt});
  }
  StatusOr<std::vector<FileLoadResult>> loaded;
  {
    ScopedGilRelease unlocked;
    loaded = LoadFileTensors(tensors, device, options);
  }
  if (interrupted) throw nb::python_error();
  std::vector<FileLoadResult> results = ValueOrThrow(std::move(loaded));
  std::vector<std::pair<nb::str, Array>> arrays;
  arrays.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    arrays.emplace_back(TensorNameToPython(file.tensors()[i].name),
                        Array(std::move(results[i].data)));
  }
  return arrays;
}

std::vector<Array> Put(const std::vector<nb::object>& objects,
                       const std::vector<std::optional<std::string>>& dtype_overrides,
                       Device* device, std::optional<std::string> device_dtype,
                       const std::string& semantics_name) {
  return PutEach(objects, dtype_overrides, device,
                 std::vector<std::optional<std::string>>(objects.size(), device_dtype),
                 semantics_name);
}

std::vector<nb::object> Get(const std::vector<Array*>& arrays) {
  ApiScope api;
  std::vector<DataPtr> data;
  std::vector<size_t> unsharded;  // positions in `arrays` of the handles in `data`
  std::vector<ShardedDataPtr> sharded(arrays.size());
  std::vector<std::shared_ptr<HostCopy>> prefetched(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i] == nullptr) {
      throw StatusError{InvalidArgumentError("device_get: None is not an Array")};
    }
    arrays[i]->CheckAlive();
    if (prefetched[i] = arrays[i]->TakeHostCopy(); prefetched[i] != nullptr) {
      continue;  // copy_to_host_async() started its reads already
    }
    if (arrays[i]->sharded()) {
      sharded[i] = arrays[i]->sharded();
    } else {
      data.push_back(arrays[i]->data());
      unsharded.push_back(i);
    }
  }
  // The long wait is usually for the puts still running: wait for them interruptibly first; the
  // reads below then run at memory speed.
  {
    std::vector<DataPtr> all = data;
    for (const ShardedDataPtr& each : sharded) {
      if (each) {
        const std::vector<DataPtr> local = each->addressable_shards();
        all.insert(all.end(), local.begin(), local.end());
      }
    }
    WaitForAll(all);
    for (const auto& copy : prefetched) {
      if (copy != nullptr) WaitInterruptibly(copy->done);
    }
  }
  std::vector<HostTensor> host(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (prefetched[i] == nullptr) continue;
    ThrowIfError(prefetched[i]->done.Await());
    host[i] = std::move(prefetched[i]->tensor);
  }
  Status status;
  {
    ScopedGilRelease unlocked;  // every read starts, then this thread waits without the GIL
    StatusOr<std::vector<HostTensor>> tensors = TransferFromDevice(data);
    status = tensors.status();
    if (status.ok()) {
      for (size_t k = 0; k < unsharded.size(); ++k) host[unsharded[k]] = std::move((*tensors)[k]);
      for (size_t i = 0; i < arrays.size() && status.ok(); ++i) {
        if (sharded[i] == nullptr) continue;
        StatusOr<HostTensor> whole = AssembleShards(*sharded[i]);
        status = whole.status();
        if (status.ok()) host[i] = *std::move(whole);
      }
    }
  }
  ThrowIfError(status);
  std::vector<nb::object> results;
  results.reserve(host.size());
  for (HostTensor& tensor : host) results.push_back(ToNumpy(std::move(tensor)));
  return results;
}

// A read into the caller's memory in flight (device_get(out=), copy_to_host_async(out=)). The reads
// hold the destinations' buffers (and so the objects) and the device data until they have
// finished, even when this object is gone first.
struct HostRead {
  Future<> done;
  nb::object out;
  uint64_t generation = ForkGeneration();

  // In a forked child, a read the parent started never completes there: FailedPrecondition.
  void CheckNotForked() const {
    if (generation != ForkGeneration()) {
      throw StatusError{FailedPreconditionError(
          "the read was started before this process was forked, and ferry's reads do not "
          "survive fork(): read again in the child")};
    }
  }
  bool IsReady() const {
    ApiScope api;  // as Array.is_ready: a poller finds what the read held released
    CheckNotForked();
    return done.IsReady();
  }
  // Waits without the GIL (interruptibly), raises the reads' error, returns `out`.
  nb::object Wait() const {
    ApiScope api;
    CheckNotForked();
    WaitInterruptibly(done);
    ThrowIfError(done.Await());
    return out;
  }
};

// Starts reading arrays[i] into leaves[i] (writable buffers of the array's dims; `overrides` as
// for puts) and returns at once; `out` is what HostRead::Wait returns. Every argument is checked
// before any read starts: a bad one raises, and nothing was written.
HostRead ReadInto(const std::vector<Array*>& arrays, nb::object out,
                  const std::vector<nb::object>& leaves,
                  const std::vector<std::optional<std::string>>& overrides,
                  const std::string& what) {
  ApiScope api;
  if (arrays.size() != leaves.size()) {
    throw StatusError{InvalidArgumentError(
        fmt::format("{}: {} destinations for {} arrays", what, leaves.size(), arrays.size()))};
  }
  std::vector<std::shared_ptr<const void>> keep_alive(arrays.size());
  std::vector<DataPtr> handles;
  std::vector<MutableHostView> views;
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i] == nullptr) {
      throw StatusError{InvalidArgumentError(fmt::format("{}: None is not an Array", what))};
    }
    std::optional<DType> override_dtype;
    if (i < overrides.size() && overrides[i].has_value()) {
      override_dtype = ParseDType(*overrides[i]);
    }
    const std::string name = arrays.size() == 1 ? "out" : fmt::format("out item {}", i);
    const MutableHostView view = ValueOrThrow(WritableViewFromPython(
        leaves[i], override_dtype, fmt::format("{}: {}", what, name), &keep_alive[i]));
    arrays[i]->AppendReads(view, fmt::format("{}: {}", what, name), &handles, &views);
  }
  Future<> done;
  {
    // Starting a read may copy a small one on this thread.
    ScopedGilRelease unlocked;
    done = TransferFromDeviceInto(handles, views);
  }
  if (done.IsReady()) ThrowIfError(done.Await());  // a bad argument: nothing was written
  // The destinations stay held until every read has finished, and are let go of (under the GIL,
  // gil.h) before the read counts as complete: once wait() returns, ferry holds none of them.
  Promise<> finished;
  done.OnReady([keep_alive = std::move(keep_alive), finished](const Status& status) mutable {
    keep_alive.clear();
    finished.Set(status);
  });
  return HostRead{finished.future(), std::move(out)};
}

// Device-to-device copies of unsharded arrays onto `device` (runtime CopyToDevice): the logical
// and device dtypes kept.
std::vector<Array> CopyArraysToDevice(const std::vector<Array*>& arrays, Device* device) {
  ApiScope api;
  if (device == nullptr) device = DeviceByName("host:0");
  CheckDeviceUsable(device);
  std::vector<DataPtr> handles;
  for (const Array* array : arrays) {
    if (array == nullptr) {
      throw StatusError{InvalidArgumentError("device_put: None is not an Array")};
    }
    array->CheckAlive();
    if (array->sharded()) {
      throw StatusError{
          InvalidArgumentError("device_put: a sharded array is copied through the "
                               "host, not device to device")};
    }
    handles.push_back(array->data());
  }
  StatusOr<std::vector<DataPtr>> copies;
  {
    ScopedGilRelease
        unlocked;  // may wait for the puts into the originals and read through the host
    copies = CopyToDevice(handles, device);
    handles.clear();
  }
  std::vector<Array> result;
  for (DataPtr& copy : ValueOrThrow(std::move(copies))) result.emplace_back(std::move(copy));
  return result;
}

std::vector<Device*> Devices(std::optional<std::string> backend) {
  ApiScope api;
  std::vector<Device*> devices;
  std::vector<std::string> backends =
      backend.has_value() ? std::vector<std::string>{*backend} : RegisteredBackends();
  for (const std::string& name : backends) {
    Client* client = nullptr;
    try {
      client = GetClient(name);
    } catch (const StatusError& error) {
      // Listing every backend skips the ones that cannot start here; asking for one raises.
      if (backend.has_value() || error.status.code() != absl::StatusCode::kUnavailable) throw;
      continue;
    }
    for (Device* device : client->devices()) devices.push_back(device);
  }
  return devices;
}

// A C++ Status becomes the Python error class that ferry/_errors.py registers for its code.
void DefineErrors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& error) {
      auto& classes = ErrorClasses();
      auto it = classes.find(static_cast<int>(error.status.code()));
      PyObject* type = it != classes.end() ? it->second : PyExc_RuntimeError;
      PyErr_SetString(type, std::string(error.status.message()).c_str());
    }
  });

  // Tests: raise the Python error that a C++ status of `code` becomes.
  m.def("_raise_status", [](int code, const std::string& message) {
    throw StatusError{Status(static_cast<absl::StatusCode>(code), message)};
  });

  m.def("_register_error", [](int code, nb::object cls) {
    ErrorClasses()[code] = cls.release().ptr();  // kept for the life of the process
  });
}

// ferry.Device: borrowed from its client, which lives as long as the process.
void DefineDeviceClass(nb::module_& m) {
  nb::class_<Device>(m, "Device",
                     "A device of a backend (ferry.devices(), ferry.device(\"host:0\")): owned by "
                     "its client, which lives as long as the process.")
      .def_prop_ro(
          "name", [](const Device& d) { return d.name(); },
          "The name in its process (\"host:0\"), as ferry.device(name) takes it: every "
          "process names its devices from 0")
      .def_prop_ro("global_name", &distributed::NameInJob,
                   "The name in the job: \"p1/host:0\" for process 1's host:0 in a job of several "
                   "processes (the same name on every process), `name` in a job of one")
      .def_prop_ro(
          "backend",
          [](const Device& d) {
            if (!d.is_addressable()) {  // another process's: it keeps its own backend
              return std::string(static_cast<const distributed::RemoteDevice&>(d).backend());
            }
            return std::string(d.client()->backend());
          })
      .def_prop_ro("index", &Device::index)
      .def_prop_ro("description", &Device::description,
                   "What the device is, in one line (a PJRT device: its plugin, API version, "
                   "platform, kind, memories and path); empty where the name says it all")
      .def_prop_ro("memory_limit",
                   [](const Device& d) { return d.capabilities().memory_limit_bytes; })
      .def_prop_ro("bytes_in_use",
                   [](const Device& d) {
                     // A forked child's copy of its parent's device counts the parent's arrays.
                     if (d.is_addressable()) CheckDeviceUsable(&d);
                     return d.bytes_in_use();
                   })
      .def(
          "memory_stats",
          [](const Device& d) -> std::optional<nb::dict> {
            if (!d.is_addressable()) return std::nullopt;
            CheckDeviceUsable(&d);
            const DeviceMemoryStats stats = d.memory_stats();
            nb::dict out;
            out["source"] = std::string(DeviceMemoryStatsSourceName(stats.source));
            out["bytes_in_use"] = stats.bytes_in_use;
            if (stats.peak_bytes_in_use) out["peak_bytes_in_use"] = *stats.peak_bytes_in_use;
            if (stats.bytes_limit) out["bytes_limit"] = *stats.bytes_limit;
            return out;
          },
          "The device's memory as its runtime counts it, like JAX's Device.memory_stats(): "
          "{'source': 'plugin', 'bytes_in_use': ..., 'peak_bytes_in_use': ..., 'bytes_limit': "
          "...} from a PJRT plugin's own allocator where it keeps statistics (a GPU's, others' "
          "buffers included), else {'source': 'ferry', 'bytes_in_use': ferry's count of its "
          "arrays, 'bytes_limit': the device's limit, if any}; None for another process's device.")
      .def_prop_ro(
          "memory_kinds",
          [](const Device& d) {
            std::vector<std::string> kinds;
            if (!d.is_addressable()) return kinds;
            for (const MemorySpace& space : d.memory_spaces()) kinds.push_back(space.kind);
            return kinds;
          },
          "The memory spaces arrays of this device may live in, its default first (a PJRT device: "
          "\"device\", \"pinned_host\", \"unpinned_host\"); device_put(..., memory_kind=...) "
          "picks one.")
      .def_prop_ro("dtypes",
                   [](const Device& d) {
                     std::vector<std::string> names;
                     for (DType dtype : d.capabilities().HeldDTypes()) {
                       names.emplace_back(DTypeName(dtype));
                     }
                     return names;
                   })
      .def("__repr__",
           [](const Device& d) { return fmt::format("Device({})", distributed::NameInJob(d)); })
      // Any other object: NotImplemented, so that `device == None`, `device in [None, ...]`
      // answer instead of raising nanobind's TypeError (Python's own __ne__ inverts this).
      .def(
          "__eq__",
          [](const Device& a, nb::handle b) -> nb::object {
            if (!nb::isinstance<Device>(b)) return nb::borrow(Py_NotImplemented);
            return nb::bool_(&a == &nb::cast<const Device&>(b));
          },
          nb::arg("other").none())
      .def("__hash__", [](const Device& d) { return std::hash<const void*>()(&d); });
}

// ferry.Array's methods written in C++; DefineArrayPythonMethods adds those written in Python.
nb::class_<Array> DefineArrayClass(nb::module_& m) {
  nb::class_<Array> array(
      m, "Array", nb::dynamic_attr(),
      "A tensor on a device, or sharded over a mesh (ferry.device_put): its logical "
      "dtype is the source's, the device may store another (device_dtype). The "
      "device memory is released with the last reference or delete().");
  array
      .def_prop_ro("shape", &Array::shape, nb::sig("def shape(self) -> tuple[int, ...]"),
                   "The shape, a tuple of ints (of the whole, for a sharded array).")
      .def_prop_ro(
          "ndim", [](const Array& a) { return a.dims().size(); },
          "The number of dimensions, len(shape).")
      .def_prop_ro("size", &Array::size, "The number of elements, the product of shape.")
      .def_prop_ro("nbytes", &Array::nbytes,
                   "Bytes of the data in its logical dtype (what to_numpy() returns), as numpy's "
                   "nbytes; the device may hold more or fewer (see device_dtype).")
      .def("__len__", &Array::length, "The size of the first dimension (TypeError for 0-d).")
      .def_prop_ro("_dtype_name", &Array::dtype_name)
      .def_prop_ro("device_dtype", &Array::device_dtype,
                   "The dtype the device stores (the first shard's, for a sharded array; see "
                   "shard_device_dtypes).")
      .def_prop_ro("shard_device_dtypes", &Array::shard_device_dtypes,
                   "The dtype each shard's device stores, in mesh order (one entry when "
                   "unsharded): a mesh mixing backends may hold different ones.")
      .def_prop_ro(
          "device",
          [](nb::handle self) -> nb::object {
            const Array& array = nb::cast<const Array&>(self);
            // As JAX: a sharded array's device is its sharding (ferry.Sharding).
            if (array.sharded()) return self.attr("sharding");
            return nb::cast(array.device(), nb::rv_policy::reference);
          },
          "The device holding the data; for a sharded array its ferry.Sharding (as JAX), whose "
          "mesh lists the devices.")
      .def("is_deleted", &Array::is_deleted,
           "Whether delete() was called: the device memory is released and every other method "
           "raises FailedPreconditionError.")
      .def("is_ready", &Array::is_ready,
           "Whether every transfer into the array has finished (never blocks).")
      .def("_block_until_ready", &Array::block_until_ready)
      .def_prop_ro(
          "is_alias", [](const Array& a) { return a.data()->buffer().is_alias(); },
          "Whether the device memory is the source's own memory (a zero_copy put the host device "
          "could alias: same dtype, dense, 64-byte aligned; see ferry.empty). False when it "
          "copied, as zero_copy does whenever aliasing is impossible.")
      .def("_start_host_copy", &Array::StartHostCopy)
      .def("_alias", &Array::Alias)
      .def(
          "copy_to_host_async",
          [](nb::handle self, nb::object out) {
            return PythonHelper("_array_copy_to_host_async")(self, out);
          },
          nb::arg("out").none() = nb::none(),
          nb::sig("def copy_to_host_async(self, out: numpy.typing.NDArray[typing.Any] | None = "
                  "None) -> ferry.HostRead | None"),
          "Starts reading the data into host memory and returns at once. Without `out`: the next "
          "to_numpy() (or device_get) takes what was read, without starting the reads again; "
          "returns None. With `out` (a writable numpy array of the array's shape and dtype, any "
          "strides): the data is read straight into it; returns a ferry.HostRead (wait() or "
          "await it), which keeps `out` alive until the read is over.")
      .def(
          "__reduce__",
          [](nb::handle self) {
            // Pickled through the host: the data as numpy, and where it was (ferry._unpickle).
            return nb::module_::import_("ferry").attr("_reduce_array")(self);
          },
          "Pickling support: the data travels as a numpy array and is put back on a device of "
          "the same name (a sharded array on a mesh of the same device names).")
      .def("delete", &Array::Delete,
           "Releases the device memory (once no transfer and no numpy view from numpy.asarray "
           "still uses it); is_deleted() is then True.")
      .def("_export_dlpack", &Array::ExportDLPack, nb::arg("max_version_major"),
           nb::arg("copy").none())
      .def("_numpy_view", &Array::NumpyView, nb::arg("stored") = false)
      .def_prop_ro("devices", &Array::devices, nb::rv_policy::reference,
                   "The devices holding the data: one, or each mesh device in mesh order.")
      .def_prop_ro("_is_sharded", [](const Array& a) { return a.sharded() != nullptr; })
      .def_prop_ro("memory_kind", &Array::memory_kind,
                   "The memory space the data lives in: \"device\" (a device's own memory), "
                   "\"pinned_host\", ... (Device.memory_kinds; device_put's memory_kind).")
      .def_prop_ro("is_fully_addressable", &Array::is_fully_addressable,
                   "Whether every shard is on this process's devices (always, in one process).")
      .def("_local_shards", &LocalShardsOf);
  return array;
}

// ferry.Array's methods written in Python (python/ferry/_arrays.py), looked up at each call.
void DefineArrayPythonMethods(nb::class_<Array>& array) {
  array
      // Written in Python (python/ferry/_arrays.py, `_array_*`), defined here on the class.
      .def(
          "__bool__", [](nb::handle self) { return PythonHelper("_array_bool")(self); },
          nb::sig("def __bool__(self) -> bool"),
          "numpy's rule: the truth of the one element; ValueError for any other size.")
      .def(
          "__float__", [](nb::handle self) { return PythonHelper("_array_float")(self); },
          nb::sig("def __float__(self) -> float"),
          "float(a): the one element of a one-element array; TypeError for any other size.")
      .def(
          "__int__", [](nb::handle self) { return PythonHelper("_array_int")(self); },
          nb::sig("def __int__(self) -> int"),
          "int(a): the one element of a one-element array (a float truncated, as numpy); "
          "TypeError for any other size.")
      .def(
          "__complex__", [](nb::handle self) { return PythonHelper("_array_complex")(self); },
          nb::sig("def __complex__(self) -> complex"),
          "complex(a): the one element of a one-element array; TypeError for any other size.")
      .def(
          "__index__", [](nb::handle self) { return PythonHelper("_array_index")(self); },
          nb::sig("def __index__(self) -> int"),
          "operator.index(a): a 0-d array of an integer dtype; TypeError for any other.")
      .def_prop_ro(
          "dtype", [](nb::handle self) { return PythonHelper("_array_dtype")(self); },
          nb::sig("def dtype(self) -> numpy.dtype[typing.Any]"),
          "The logical dtype (the source's), as a numpy dtype: what to_numpy() returns.")
      .def_prop_ro(
          "sharding", [](nb::handle self) { return PythonHelper("_array_sharding")(self); },
          nb::sig("def sharding(self) -> ferry.Sharding | None"),
          "The ferry.Sharding of a sharded array; None for an array on one device.")
      .def(
          "to_numpy", [](nb::handle self) { return PythonHelper("_array_to_numpy")(self); },
          nb::sig("def to_numpy(self) -> numpy.typing.NDArray[typing.Any]"),
          "The data as a new numpy array in the logical dtype (waits without the GIL).")
      .def(
          "block_until_ready",
          [](nb::handle self) { return PythonHelper("_array_block_until_ready")(self); },
          nb::sig("def block_until_ready(self) -> Array"),
          "Waits until every transfer into the array has finished (raising its error, if any); "
          "returns the array.")
      .def(
          "local_shards", [](nb::handle self) { return PythonHelper("_array_local_shards")(self); },
          nb::sig("def local_shards(self) -> list[ferry.Shard]"),
          "This process's shards (one per mesh device of this process, in mesh order) read back, "
          "each with its device, index and device dtype; an unsharded array has one shard, all "
          "of it.")
      .def_prop_ro(
          "addressable_shards",
          [](nb::handle self) { return PythonHelper("_array_local_shards")(self); },
          nb::sig("def addressable_shards(self) -> list[ferry.Shard]"),
          "This process's shards, as local_shards() (JAX's name).")
      .def(
          "__array__",
          [](nb::handle self, nb::object dtype, nb::object copy) {
            return PythonHelper("_array_array")(self, dtype, copy);
          },
          nb::arg("dtype").none() = nb::none(), nb::arg("copy").none() = nb::none(),
          nb::sig("def __array__(self, dtype: typing.Any = None, copy: bool | None = None) -> "
                  "numpy.typing.NDArray[typing.Any]"),
          "numpy's array protocol: a read-only view of the device memory where numpy can read "
          "it as it is (host memory, stored in its own dtype, unsharded), else a copy; "
          "copy=True always copies, copy=False raises ValueError where a view is impossible "
          "(numpy 2's rules; docs/python.md).")
      .def(
          "__repr__", [](nb::handle self) { return PythonHelper("_array_repr")(self); },
          nb::sig("def __repr__(self) -> str"))
      .def(
          "__dlpack__",
          [](nb::handle self, nb::object stream, nb::object max_version, nb::object dl_device,
             nb::object copy) {
            return PythonHelper("_array_dlpack")(
                self, nb::arg("stream") = stream, nb::arg("max_version") = max_version,
                nb::arg("dl_device") = dl_device, nb::arg("copy") = copy);
          },
          nb::kw_only(), nb::arg("stream").none() = nb::none(),
          nb::arg("max_version").none() = nb::none(), nb::arg("dl_device").none() = nb::none(),
          nb::arg("copy").none() = nb::none(),
          nb::sig("def __dlpack__(self, *, stream: typing.Any = None, max_version: "
                  "tuple[int, int] | None = None, dl_device: typing.Any = None, copy: bool | None "
                  "= None) -> typing.Any"),
          "DLPack export of an array in host-addressable memory or a GPU plugin's device memory "
          "(docs/python.md).")
      .def("__dlpack_device__", &Array::DLPackDevice,
           nb::sig("def __dlpack_device__(self) -> tuple[int, int]"),
           "(1, 0) for arrays in host-addressable memory, (2, ordinal) in a CUDA plugin's "
           "memory, (10, ordinal) in a ROCm plugin's.");
}

// ferry.HostRead: a read into the caller's memory in flight.
void DefineHostReadClass(nb::module_& m) {
  nb::class_<HostRead>(m, "HostRead",
                       "A read into the caller's memory in flight (Array.copy_to_host_async(out=), "
                       "made by device_get(out=) too): it holds the destination until the read is "
                       "over, even when this object is dropped first.")
      .def_prop_ro(
          "out", [](const HostRead& read) { return read.out; },
          "What the read writes into: the `out` it was given.")
      .def("is_ready", &HostRead::IsReady,
           "Whether the read has finished (never blocks). In a process forked while it ran: "
           "FailedPreconditionError.")
      .def("wait", &HostRead::Wait,
           "Waits until the read has finished (without the GIL; Ctrl-C raises "
           "KeyboardInterrupt and the read carries on), raises its error, and returns `out`.")
      // Written in Python (python/ferry/_arrays.py, `_host_read_await`).
      .def(
          "__await__", [](nb::handle self) { return PythonHelper("_host_read_await")(self); },
          nb::sig("def __await__(self) -> typing.Generator[typing.Any, None, typing.Any]"),
          "`await read` in asyncio: waits in the running loop's default executor, then returns "
          "`out` (or raises the read's error).");
}

// Meshes, shardings and the sharded puts.
void DefineShardingFunctions(nb::module_& m) {
  nb::class_<Mesh>(m, "_Mesh")
      .def("__init__",
           [](Mesh* self, std::vector<Device*> devices, std::vector<int64_t> shape,
              std::vector<std::string> axis_names) {
             for (const Device* device : devices) {
               if (device != nullptr && device->is_addressable()) CheckDeviceUsable(device);
             }
             new (self) Mesh(ValueOrThrow(
                 Mesh::Create(std::move(devices), std::move(shape), std::move(axis_names))));
           })
      .def_prop_ro("devices", &Mesh::devices, nb::rv_policy::reference)
      .def_prop_ro("shape", &Mesh::shape)
      .def_prop_ro("axis_names", &Mesh::axis_names);

  nb::class_<Sharding>(m, "_Sharding")
      .def("__init__",
           [](Sharding* self, const Mesh& mesh, std::vector<std::vector<std::string>> spec) {
             new (self) Sharding(ValueOrThrow(Sharding::Create(mesh, std::move(spec))));
           })
      .def_prop_ro("mesh", &Sharding::mesh)
      .def_prop_ro("spec", &Sharding::spec)
      .def("shard_indices", [](const Sharding& sharding, const std::vector<int64_t>& shape) {
        std::vector<nb::list> indices;
        for (const ShardIndex& index : ValueOrThrow(sharding.ShardIndices(shape))) {
          indices.push_back(IndexToPython(index));
        }
        return indices;
      });
  m.def("put_sharded", &PutSharded, nb::arg("object"), nb::arg("dtype_override").none(),
        nb::arg("sharding"), nb::arg("device_dtype").none(), nb::arg("semantics"),
        nb::arg("memory_kind").none() = nb::none());
  m.def("make_from_shards", &MakeFromShards, nb::arg("shape"), nb::arg("sharding"),
        nb::arg("objects"), nb::arg("dtype_overrides"), nb::arg("device_dtype").none(),
        nb::arg("semantics"), nb::arg("dtype").none() = nb::none());
  m.def("array_sharding", [](const Array& a) -> std::optional<Sharding> {
    a.CheckAlive();
    if (!a.sharded()) return std::nullopt;
    return a.sharded()->sharding();
  });
}

// Puts, gets and loads onto one device, and the devices themselves.
void DefineTransferFunctions(nb::module_& m) {
  m.def("put", &Put, nb::arg("objects"), nb::arg("dtype_overrides"), nb::arg("device").none(),
        nb::arg("device_dtype").none(), nb::arg("semantics"));
  m.def("put_each", &PutEach, nb::arg("objects"), nb::arg("dtype_overrides"),
        nb::arg("device").none(), nb::arg("device_dtypes"), nb::arg("semantics"),
        nb::arg("memory_kind").none() = nb::none(), nb::arg("tensor_names").none() = nb::none());
  m.def("put_one", &PutOne, nb::arg("object"), nb::arg("device").none(), nb::arg("semantics"));
  m.def("_load_file_onto", &LoadFileOnto, nb::arg("path"), nb::arg("names"), nb::arg("patterns"),
        nb::arg("exclude"), nb::arg("device"), nb::arg("device_dtype").none(),
        nb::arg("device_dtype_all"));
  m.def("get", &Get, nb::arg("arrays"));
  m.def("read_into", &ReadInto, nb::arg("arrays"), nb::arg("out"), nb::arg("leaves"),
        nb::arg("overrides"), nb::arg("what"));
  m.def("copy_to_device", &CopyArraysToDevice, nb::arg("arrays"), nb::arg("device").none());
  m.def("_backend_started", [](const std::string& backend) {
    ClientRegistry& registry = Registry();
    ScopedGilRelease unlocked;  // as in GetClient: never the GIL and the mutex at once
    MutexLock lock(registry.mutex);
    return registry.clients.contains(backend);
  });
  m.def("devices", &Devices, nb::arg("backend").none() = nb::none(), nb::rv_policy::reference);
  m.def("device", &DeviceByName, nb::rv_policy::reference);
}

// ferry.metrics() and ferry.settings() (docs/settings.md).
void DefineMetricsAndSettings(nb::module_& m) {
  m.def("metrics", [] { return MetricsSnapshot(); });
  m.def("_device_count_hint", [](const std::string& backend) { return DeviceCountHint(backend); });
  m.def("metrics_report", [] { return MetricsReport(); });
  m.def("reset_metrics", [] { ResetMetrics(); });
  m.def("set_setting", [](const std::string& name, const std::string& value) {
    ThrowIfError(SetSetting(name, value));
  });
  m.def("clear_setting", [](const std::string& name) { ThrowIfError(ClearSetting(name)); });
  // One dict per row of the table, with the value in effect now.
  m.def("settings", [] {
    nb::list rows;
    for (const SettingInfo& setting : AllSettings()) {
      const SettingValue value = ValueOrThrow(CurrentSettingValue(setting.name));
      nb::dict row;
      row["name"] = std::string(setting.name);
      row["scope"] = setting.scope == SettingScope::kProcess  ? "process"
                     : setting.scope == SettingScope::kClient ? "client"
                                                              : "plugin";
      row["kind"] = std::string(setting.value_kind);
      row["default"] = std::string(setting.default_value);
      row["client_option"] = std::string(setting.client_option);
      row["meaning"] = std::string(setting.meaning);
      if (value.text.has_value()) {
        row["value"] = *value.text;
      } else {
        row["value"] = nb::none();
      }
      row["source"] = value.source == SettingSource::kOverride      ? "override"
                      : value.source == SettingSource::kEnvironment ? "environment"
                                                                    : "default";
      rows.append(row);
    }
    return rows;
  });
}

// Hooks for the tests and for the exit: the GIL release, the deferred release of device memory,
// nanobind's leak report.
void DefineRuntimeHooks(nb::module_& m) {
  m.def("_set_release_gil", &SetReleaseGil);
  m.def("_set_deferred_release", &SetDeferredRelease);
  m.def("_release_gil_enabled", &ReleaseGilEnabled);
  m.def("_deferred_release_enabled", &DeferredReleaseEnabled);
  m.def("_pending_release_count", &PendingReleaseCount);
  m.def("_drain_release_queue", &DrainReleaseQueue);
  // nanobind reports, as the interpreter ends, every object of this module still alive then, as a
  // reference counting bug. __init__.py turns that report off only for an exit at which daemon
  // threads still run: the interpreter freezes them where they are, and what their frames hold
  // (their device, their latest array) is never freed, by design rather than by a bug.
  m.def("_set_leak_warnings", [](bool enabled) { nb::set_leak_warnings(enabled); });
  m.def("_hold_package", &HoldPackage, nb::arg("package"),
        "Called by the ferry package once imported: the Array methods written in Python find it "
        "from then on even while the interpreter finalises (sys.modules emptied).");
}

}  // namespace

NB_MODULE(_ferry, m) {
  m.doc() = "ferry's C++ core; use the `ferry` package.";
  m.attr("__version__") = ferry::kVersion;
  InstallForkHandler();
  RecordMainThread();

  DefineErrors(m);
  DefineDeviceClass(m);
  nb::class_<Array> array = DefineArrayClass(m);
  DefineArrayPythonMethods(array);
  DefineHostReadClass(m);
  DefineShardingFunctions(m);
  DefineTransferFunctions(m);
  DefineMetricsAndSettings(m);
  DefineRuntimeHooks(m);
  AddTensorFileFunctions(m);
  AddDistributedFunctions(m);
}

}  // namespace ferry::python
