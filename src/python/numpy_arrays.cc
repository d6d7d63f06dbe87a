#include "src/python/numpy_arrays.h"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fmt/format.h"
#include "src/python/status_error.h"

namespace nb = nanobind;

namespace ferry::python {

nb::dlpack::dtype StorageDLPackDType(DType dtype) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  switch (dtype) {
    case DType::kBF16:
    case DType::kF8E4M3FN:
    case DType::kF8E5M2:
      return nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::UInt),
                               static_cast<uint8_t>(info.size_bytes * 8), 1};
    default:
      return nb::dlpack::dtype{info.dlpack_code, info.dlpack_bits, 1};
  }
}

namespace {

// numpy 2's NPY_MAXDIMS: a tensor of more dimensions (which a file may hold, and a device buffer)
// has no numpy array; said as ferry's error, not as nanobind's export failure.
constexpr size_t kNumpyMaxDims = 64;

void CheckNumpyRank(size_t rank, std::string_view what) {
  if (rank <= kNumpyMaxDims) return;
  throw StatusError{InvalidArgumentError(fmt::format(
      "{} has {} dimensions, and a numpy array has at most {}", what, rank, kNumpyMaxDims))};
}

}  // namespace

nb::object ToNumpy(HostTensor tensor) {
  CheckNumpyRank(tensor.dims().size(), "the tensor read back");
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  std::vector<size_t> shape(owned->dims().begin(), owned->dims().end());
  nb::ndarray<nb::numpy> array(owned->data(), shape.size(), shape.data(), owner, nullptr,
                               StorageDLPackDType(owned->dtype()));
  return nb::cast(array, nb::rv_policy::reference);
}

nb::object ReadOnlyNumpyView(std::shared_ptr<const TensorSource> source) {
  const HostView view = source->view();
  const std::string name = source->name();
  return ReadOnlyNumpyView(view, std::shared_ptr<const void>(std::move(source)), name);
}

nb::object ReadOnlyNumpyView(const HostView& view, std::shared_ptr<const void> owner,
                             std::string_view name) {
  CheckNumpyRank(view.dims.size(), fmt::format("tensor '{}'", name));
  const int64_t element_size = view.element_size();
  std::vector<size_t> shape(view.dims.begin(), view.dims.end());
  std::vector<int64_t> strides;  // numpy's, through DLPack: in elements
  for (int64_t byte_stride : view.byte_strides) {
    if (byte_stride % element_size != 0) {
      throw StatusError{InvalidArgumentError(
          fmt::format("tensor '{}': byte stride {} is not a multiple of the element size {}", name,
                      byte_stride, element_size))};
    }
    strides.push_back(byte_stride / element_size);
  }
  const nb::dlpack::dtype dtype = StorageDLPackDType(view.dtype);
  auto* held = new std::shared_ptr<const void>(std::move(owner));
  nb::capsule capsule(
      held, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  nb::ndarray<nb::numpy, nb::ro> array(view.data, shape.size(), shape.data(), capsule,
                                       strides.data(), dtype);
  return nb::cast(array, nb::rv_policy::reference);
}

}  // namespace ferry::python

namespace ferry::python {
namespace {

// The DLPack 1.x ABI (dlpack.h; Debian's copy predates the versioned struct), declared here for
// the one struct ferry hands out.
namespace dl {
struct PackVersion {
  uint32_t major;
  uint32_t minor;
};
struct Device {
  int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2, kDLROCM = 10
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};
struct ManagedTensorVersioned {
  PackVersion version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  uint64_t flags;
  Tensor dl_tensor;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
constexpr uint64_t kFlagReadOnly = uint64_t{1} << 0;
constexpr uint64_t kFlagIsCopied = uint64_t{1} << 1;
}  // namespace dl

// What a capsule owns: the struct handed out, its shape and strides, and the memory's owner.
template <typename Managed>
struct ExportedTensor {
  Managed managed{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::shared_ptr<const void> owner;
  uint64_t id = 0;  // in LiveExports until freed; also the capsule's context
};

// The ids of the exported tensors not freed yet. Whoever takes an id out of the set frees its
// tensor (the deleter, or the destructor of a capsule nobody consumed), so a tensor is freed
// once even when a consumer calls the deleter and leaves the capsule unconsumed (torch_xla's
// from_dlpack, failing after it took the tensor: the capsule's destructor then called the
// deleter a second time, a double free). Ids are never reused, so a capsule's id cannot name a
// later tensor at the same address; the capsule keeps its id in its context, readable after the
// tensor is gone.
struct LiveExports {
  std::mutex mutex;
  absl::flat_hash_set<uint64_t> ids;
  uint64_t next_id = 1;
};
LiveExports& Live() {
  static auto* live = new LiveExports();  // never destroyed: deleters may run during exit
  return *live;
}
uint64_t AddLiveExport() {
  LiveExports& live = Live();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.ids.insert(live.next_id);
  return live.next_id++;
}
// True for the one caller that takes `id` out (and must free its tensor).
bool TakeLiveExport(uint64_t id) {
  LiveExports& live = Live();
  std::lock_guard<std::mutex> lock(live.mutex);
  return live.ids.erase(id) == 1;
}

// DLPack's deleter: any thread.
template <typename Managed>
void DeleteExported(Managed* managed) {
  auto* exported = static_cast<ExportedTensor<Managed>*>(managed->manager_ctx);
  if (TakeLiveExport(exported->id)) delete exported;
}

// A capsule that nobody consumed still owns its tensor and frees it here, unless a consumer
// called the deleter already (a consumer renames the capsule to "used_..." and calls the deleter
// itself; some also clear this destructor).
template <typename Managed>
void CapsuleDestructor(PyObject* capsule, const char* name) {
  if (!PyCapsule_IsValid(capsule, name)) return;
  const auto id = reinterpret_cast<uintptr_t>(PyCapsule_GetContext(capsule));
  auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, name));
  if (managed != nullptr && TakeLiveExport(id)) {
    delete static_cast<ExportedTensor<Managed>*>(managed->manager_ctx);
  }
  PyErr_Clear();
}

template <typename Managed>
nb::object MakeCapsule(const HostView& view, std::shared_ptr<const void> owner, dl::Device device,
                       uint64_t flags, const char* name, PyCapsule_Destructor destructor) {
  const int64_t element_size = view.element_size();
  auto exported = std::make_unique<ExportedTensor<Managed>>();
  exported->shape.assign(view.dims.begin(), view.dims.end());
  for (int64_t byte_stride : view.byte_strides) {
    if (byte_stride % element_size != 0) {
      throw StatusError{InvalidArgumentError(
          fmt::format("DLPack export: byte stride {} is not a multiple of the element size {}",
                      byte_stride, element_size))};
    }
    exported->strides.push_back(byte_stride / element_size);
  }
  exported->owner = std::move(owner);
  const DTypeInfo& info = GetDTypeInfo(view.dtype);
  Managed& managed = exported->managed;
  dl::Tensor& tensor = managed.dl_tensor;
  tensor.data = const_cast<void*>(view.data);
  tensor.device = device;
  tensor.ndim = static_cast<int32_t>(exported->shape.size());
  tensor.dtype = {info.dlpack_code, info.dlpack_bits, 1};
  tensor.shape = exported->shape.data();
  tensor.strides = exported->strides.data();
  tensor.byte_offset = 0;
  managed.manager_ctx = exported.get();
  managed.deleter = &DeleteExported<Managed>;
  if constexpr (std::is_same_v<Managed, dl::ManagedTensorVersioned>) {
    managed.version = {1, 0};
    managed.flags = flags;
  }
  PyObject* capsule = PyCapsule_New(&managed, name, destructor);
  if (capsule == nullptr) throw nb::python_error();
  exported->id = AddLiveExport();
  if (PyCapsule_SetContext(capsule,
                           reinterpret_cast<void*>(static_cast<uintptr_t>(exported->id))) != 0) {
    TakeLiveExport(exported->id);
    Py_DECREF(capsule);  // its destructor finds no live id: frees nothing
    throw nb::python_error();
  }
  exported.release();  // owned by the capsule (or, once consumed, by the consumer) from here
  return nb::steal(capsule);
}

}  // namespace

nb::object DLPackCapsule(const HostView& view, std::shared_ptr<const void> owner,
                         const DLPackExport& how) {
  const dl::Device device{how.device_type, how.device_id};
  if (how.versioned) {
    const uint64_t flags =
        (how.read_only ? dl::kFlagReadOnly : 0) | (how.copied ? dl::kFlagIsCopied : 0);
    return MakeCapsule<dl::ManagedTensorVersioned>(
        view, std::move(owner), device, flags, "dltensor_versioned", [](PyObject* capsule) {
          CapsuleDestructor<dl::ManagedTensorVersioned>(capsule, "dltensor_versioned");
        });
  }
  if (how.read_only) {
    throw StatusError{InternalError("an unversioned DLPack capsule cannot be read-only")};
  }
  return MakeCapsule<dl::ManagedTensor>(
      view, std::move(owner), device, 0, "dltensor",
      [](PyObject* c) { CapsuleDestructor<dl::ManagedTensor>(c, "dltensor"); });
}

}  // namespace ferry::python
