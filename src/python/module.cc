// The `ferry._ferry` extension module: the C++ side of the Python API (python/ferry/__init__.py
// holds the Python side). Every entry point drains the release queue (gil.h, defence 2) and every
// call that can wait releases the GIL (defence 1).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "fmt/format.h"
#include "src/python/gil.h"
#include "src/python/numpy_arrays.h"
#include "src/python/py_source.h"
#include "src/python/status_error.h"
#include "src/python/tensor_files.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// absl::StatusCode -> Python exception class, filled by ferry/__init__.py at import.
std::map<int, PyObject*>& ErrorClasses() {
  static auto* classes = new std::map<int, PyObject*>();
  return *classes;
}

// Backends' clients, created on first use and kept for the life of the process (destroying them
// at interpreter exit would race with finalisation; the OS reclaims everything).
Client* GetClient(const std::string& backend) {
  static std::mutex mutex;
  static auto* clients = new std::map<std::string, std::unique_ptr<Client>, std::less<>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = clients->find(backend);
  if (it == clients->end()) {
    std::unique_ptr<Client> client = ValueOrThrow(CreateClient(backend));
    it = clients->emplace(backend, std::move(client)).first;
  }
  return it->second.get();
}

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
    throw StatusError{absl::NotFoundError(fmt::format(
        "device '{}' does not exist: backend {} has {} device(s)", name, backend, devices.size()))};
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

// A device array: one Data handle, or a tensor sharded over a mesh.
class Array {
 public:
  explicit Array(DataPtr data) : data_(std::move(data)) {}
  explicit Array(ShardedDataPtr sharded) : sharded_(std::move(sharded)) {}

  bool is_deleted() const { return data_ == nullptr && sharded_ == nullptr; }
  void CheckAlive() const {
    if (is_deleted()) throw StatusError{FailedPreconditionError("the array has been deleted")};
  }
  // The single handle of an unsharded array (the first shard's, for a sharded one).
  const DataPtr& data() const {
    CheckAlive();
    return sharded_ ? sharded_->shards().front() : data_;
  }
  const ShardedDataPtr& sharded() const { return sharded_; }
  // Every Data handle: one, or one per mesh device.
  std::vector<DataPtr> handles() const {
    CheckAlive();
    return sharded_ ? sharded_->shards() : std::vector<DataPtr>{data_};
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
  Device* device() const { return data()->device(); }
  std::vector<Device*> devices() const {
    std::vector<Device*> devices;
    for (const DataPtr& handle : handles()) devices.push_back(handle->device());
    return devices;
  }
  bool is_ready() const {
    for (const DataPtr& handle : handles()) {
      if (!handle->Ready().IsReady()) return false;
    }
    return true;
  }
  void block_until_ready() const {
    ApiScope api;
    std::vector<DataPtr> all = handles();
    Status status;
    {
      ScopedGilRelease unlocked;
      status = AwaitReady(all);
    }
    ThrowIfError(status);
  }
  void Delete() {
    data_.reset();
    sharded_.reset();
  }
  // A read-only, zero-copy view of the device data (host-accessible devices only), keeping the
  // array's data alive.
  nb::object host_view() const {
    if (sharded_) {
      throw StatusError{UnimplementedError("DLPack export of a sharded array: use local_shards()")};
    }
    DataPtr data_ref = data();
    block_until_ready();
    HostView view = ValueOrThrow(data_ref->buffer().HostAccessibleView());
    auto* keep = new DataPtr(data_ref);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<DataPtr*>(p); });
    std::vector<size_t> shape(view.dims.begin(), view.dims.end());
    const DTypeInfo& info = GetDTypeInfo(view.dtype);
    nb::ndarray<nb::ro> array(view.data, shape.size(), shape.data(), owner, nullptr,
                              nb::dlpack::dtype{info.dlpack_code, info.dlpack_bits, 1});
    return nb::cast(array, nb::rv_policy::reference);
  }

 private:
  DataPtr data_;
  ShardedDataPtr sharded_;
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
                                    const std::optional<std::string>& device_dtype) {
  TransferToDeviceOptions options;
  options.semantics = ParseSemantics(semantics);
  if (device_dtype.has_value()) options.device_dtypes.assign(count, ParseDType(*device_dtype));
  return options;
}

std::vector<std::shared_ptr<const TensorSource>> SourcesFromPython(
    const std::vector<nb::object>& objects,
    const std::vector<std::optional<std::string>>& dtype_overrides, std::string_view what) {
  std::vector<std::shared_ptr<const TensorSource>> sources;
  sources.reserve(objects.size());
  for (size_t i = 0; i < objects.size(); ++i) {
    std::optional<DType> override_dtype;
    if (i < dtype_overrides.size() && dtype_overrides[i].has_value()) {
      override_dtype = ParseDType(*dtype_overrides[i]);
    }
    std::string name = objects.size() == 1 ? std::string(what) : fmt::format("{} {}", what, i);
    sources.push_back(ValueOrThrow(SourceFromPython(objects[i], override_dtype, std::move(name))));
  }
  return sources;
}

int64_t TotalBytes(const std::vector<std::shared_ptr<const TensorSource>>& sources) {
  int64_t total = 0;
  for (const auto& source : sources) total += source->view().dense_size_bytes();
  return total;
}

// A "copy" put waits for the copy; small ones run inline and are not worth a GIL hand-off.
bool MayWait(const TransferToDeviceOptions& options, int64_t bytes) {
  return options.semantics == HostBufferSemantics::kImmutableOnlyDuringCall &&
         bytes > (int64_t{256} << 10);
}

Array PutSharded(nb::object object, std::optional<std::string> dtype_override,
                 const Sharding& sharding, std::optional<std::string> device_dtype,
                 const std::string& semantics) {
  ApiScope api;
  TransferToDeviceOptions options = MakeOptions(semantics, 1, device_dtype);
  auto sources = SourcesFromPython({object}, {dtype_override}, "array");
  StatusOr<ShardedDataPtr> data;
  {
    ScopedGilRelease unlocked(MayWait(options, TotalBytes(sources)));
    data = TransferShardsToDevice(std::move(sources[0]), sharding, options);
    sources.clear();
  }
  return Array(ValueOrThrow(std::move(data)));
}

Array MakeFromShards(const std::vector<int64_t>& shape, const Sharding& sharding,
                     const std::vector<nb::object>& objects,
                     const std::vector<std::optional<std::string>>& dtype_overrides,
                     std::optional<std::string> device_dtype, const std::string& semantics) {
  ApiScope api;
  TransferToDeviceOptions options = MakeOptions(semantics, 1, device_dtype);
  auto sources = SourcesFromPython(objects, dtype_overrides, "shard");
  StatusOr<ShardedDataPtr> data;
  {
    ScopedGilRelease unlocked(MayWait(options, TotalBytes(sources)));
    data = MakeArrayFromShards(shape, sharding, sources, options);
    sources.clear();
  }
  return Array(ValueOrThrow(std::move(data)));
}

std::vector<Array> Put(const std::vector<nb::object>& objects,
                       const std::vector<std::optional<std::string>>& dtype_overrides,
                       Device* device, std::optional<std::string> device_dtype,
                       const std::string& semantics_name) {
  ApiScope api;
  if (device == nullptr) device = DeviceByName("host:0");
  TransferToDeviceOptions options = MakeOptions(semantics_name, objects.size(), device_dtype);
  auto sources = SourcesFromPython(objects, dtype_overrides, "array");
  const int64_t total_bytes = TotalBytes(sources);
  StatusOr<std::vector<DataPtr>> data;
  {
    ScopedGilRelease unlocked(MayWait(options, total_bytes));
    data = TransferToDevice(sources, device, options);
    sources.clear();  // our references go here: the transfers hold their own
  }
  std::vector<DataPtr> handles = ValueOrThrow(std::move(data));
  std::vector<Array> arrays;
  arrays.reserve(handles.size());
  for (DataPtr& handle : handles) arrays.emplace_back(std::move(handle));
  return arrays;
}

std::vector<nb::object> Get(const std::vector<Array*>& arrays) {
  ApiScope api;
  std::vector<DataPtr> data;
  std::vector<size_t> unsharded;  // positions in `arrays` of the handles in `data`
  std::vector<ShardedDataPtr> sharded(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    if (arrays[i] == nullptr) {
      throw StatusError{InvalidArgumentError("device_get: None is not an Array")};
    }
    arrays[i]->CheckAlive();
    if (arrays[i]->sharded()) {
      sharded[i] = arrays[i]->sharded();
    } else {
      data.push_back(arrays[i]->data());
      unsharded.push_back(i);
    }
  }
  std::vector<HostTensor> host(arrays.size());
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

}  // namespace

NB_MODULE(_ferry, m) {
  m.doc() = "ferry's C++ core; use the `ferry` package.";

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

  m.def("_register_error", [](int code, nb::object cls) {
    ErrorClasses()[code] = cls.release().ptr();  // kept for the life of the process
  });

  nb::class_<Device>(m, "Device")
      .def_prop_ro("name", [](const Device& d) { return d.name(); })
      .def_prop_ro("backend", [](const Device& d) { return std::string(d.client()->backend()); })
      .def_prop_ro("index", &Device::index)
      .def_prop_ro("memory_limit",
                   [](const Device& d) { return d.capabilities().memory_limit_bytes; })
      .def_prop_ro("bytes_in_use", &Device::bytes_in_use)
      .def_prop_ro("dtypes",
                   [](const Device& d) {
                     std::vector<std::string> names;
                     for (DType dtype : d.capabilities().HeldDTypes()) {
                       names.emplace_back(DTypeName(dtype));
                     }
                     return names;
                   })
      .def("__repr__", [](const Device& d) { return fmt::format("Device({})", d.name()); })
      .def("__eq__", [](const Device& a, const Device& b) { return &a == &b; })
      .def("__hash__", [](const Device& d) { return std::hash<const void*>()(&d); });

  nb::class_<Array>(m, "Array", nb::dynamic_attr())
      .def_prop_ro("shape", &Array::shape)
      .def_prop_ro("_dtype_name", &Array::dtype_name)
      .def_prop_ro("device_dtype", &Array::device_dtype)
      .def_prop_ro("device", &Array::device, nb::rv_policy::reference)
      .def_prop_ro("is_deleted", &Array::is_deleted)
      .def("is_ready", &Array::is_ready)
      .def("_block_until_ready", &Array::block_until_ready)
      .def("delete", &Array::Delete)
      .def("_host_view", &Array::host_view)
      .def_prop_ro("devices", &Array::devices, nb::rv_policy::reference)
      .def_prop_ro("_is_sharded", [](const Array& a) { return a.sharded() != nullptr; })
      .def("_local_shards", &LocalShardsOf);

  nb::class_<Mesh>(m, "_Mesh")
      .def("__init__",
           [](Mesh* self, std::vector<Device*> devices, std::vector<int64_t> shape,
              std::vector<std::string> axis_names) {
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
        nb::arg("sharding"), nb::arg("device_dtype").none(), nb::arg("semantics"));
  m.def("make_from_shards", &MakeFromShards, nb::arg("shape"), nb::arg("sharding"),
        nb::arg("objects"), nb::arg("dtype_overrides"), nb::arg("device_dtype").none(),
        nb::arg("semantics"));
  m.def("array_sharding", [](const Array& a) -> std::optional<Sharding> {
    a.CheckAlive();
    if (!a.sharded()) return std::nullopt;
    return a.sharded()->sharding();
  });

  m.def("put", &Put, nb::arg("objects"), nb::arg("dtype_overrides"), nb::arg("device").none(),
        nb::arg("device_dtype").none(), nb::arg("semantics"));
  m.def("get", &Get, nb::arg("arrays"));
  m.def("devices", &Devices, nb::arg("backend").none() = nb::none(), nb::rv_policy::reference);
  m.def("device", &DeviceByName, nb::rv_policy::reference);
  m.def("metrics", [] { return MetricsSnapshot(); });
  m.def("metrics_report", [] { return MetricsReport(); });
  m.def("reset_metrics", [] { ResetMetrics(); });

  m.def("_set_release_gil", &SetReleaseGil);
  m.def("_set_deferred_release", &SetDeferredRelease);
  m.def("_release_gil_enabled", &ReleaseGilEnabled);
  m.def("_deferred_release_enabled", &DeferredReleaseEnabled);
  m.def("_pending_release_count", &PendingReleaseCount);
  m.def("_drain_release_queue", &DrainReleaseQueue);

  AddTensorFileFunctions(m);
}

}  // namespace ferry::python
