#include "src/python/py_source.h"

#include <nanobind/ndarray.h>

#include <bit>
#include <functional>

#include "ferry/io/mapped_file.h"
#include "fmt/format.h"
#include "src/python/gil.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

class HeldBuffer final : public PyHeld {
 public:
  HeldBuffer() = default;
  ~HeldBuffer() override {
    if (acquired) PyBuffer_Release(&view);
  }
  Py_buffer view{};
  bool acquired = false;
};

class HeldNdarray final : public PyHeld {
 public:
  explicit HeldNdarray(nb::ndarray<nb::ro, nb::device::cpu> array) : array(std::move(array)) {}
  nb::ndarray<nb::ro, nb::device::cpu> array;
};

StatusOr<std::shared_ptr<const TensorSource>> BorrowFrom(HostView view,
                                                         std::shared_ptr<const void> keep_alive,
                                                         std::string name) {
  // The producer vouches for its memory: the region is exactly what the view addresses.
  FERRY_ASSIGN_OR_RETURN(AddressedBytes addressed, view.ComputeAddressedBytes(name));
  const auto* base = static_cast<const std::byte*>(view.data);
  const std::byte* region = base + addressed.begin;
  const int64_t region_size = addressed.end - addressed.begin;
  // Memory of a file ferry mapped (a view from ferry.open_file or load_file) may lose its pages
  // to a truncation while a transfer reads it: the transfer then reports DataLoss for this array
  // alone. Asked only while some file is mapped (else no memory can be a mapping's).
  std::function<Status()> read_check;
  if (MappedFile::AnyMapped()) {
    read_check = [region, region_size] {
      return MappedFile::CheckMemoryIntact(region, region_size);
    };
  }
  return TensorSource::Borrow(view, region, region_size, std::move(keep_alive), std::move(name),
                              std::move(read_check));
}

Status ApplyOverride(HostView& view, std::optional<DType> dtype_override, std::string_view name) {
  if (!dtype_override.has_value()) return OkStatus();
  if (DTypeSize(*dtype_override) != DTypeSize(view.dtype)) {
    return InvalidArgumentError(fmt::format("tensor '{}': cannot read {} elements as {}", name,
                                            DTypeName(view.dtype), DTypeName(*dtype_override)));
  }
  view.dtype = *dtype_override;
  return OkStatus();
}

}  // namespace

StatusOr<DType> DTypeFromBufferFormat(std::string_view format, int64_t itemsize, bool* big_endian) {
  static_assert(std::endian::native == std::endian::little, "ferry assumes a little-endian host");
  std::string_view code = format;
  if (big_endian != nullptr) *big_endian = false;
  if (!code.empty() && (code[0] == '@' || code[0] == '=' || code[0] == '<')) code.remove_prefix(1);
  if (!code.empty() && (code[0] == '>' || code[0] == '!')) {
    code.remove_prefix(1);
    if (big_endian != nullptr) *big_endian = true;
  }
  DType dtype;
  if (code == "?")
    dtype = DType::kBool;
  else if (code == "b")
    dtype = DType::kS8;
  else if (code == "B")
    dtype = DType::kU8;
  else if (code == "h")
    dtype = DType::kS16;
  else if (code == "H")
    dtype = DType::kU16;
  else if (code == "i")
    dtype = DType::kS32;
  else if (code == "I")
    dtype = DType::kU32;
  else if (code == "l" || code == "q")
    dtype = itemsize == 4 ? DType::kS32 : DType::kS64;
  else if (code == "L" || code == "Q")
    dtype = itemsize == 4 ? DType::kU32 : DType::kU64;
  else if (code == "e")
    dtype = DType::kF16;
  else if (code == "f")
    dtype = DType::kF32;
  else if (code == "d")
    dtype = DType::kF64;
  else if (code == "Zf")
    dtype = DType::kC64;
  else if (code == "Zd")
    dtype = DType::kC128;
  else {
    return InvalidArgumentError(fmt::format(
        "buffer format '{}' has no ferry dtype (object and structured arrays cannot be moved)",
        format));
  }
  if (DTypeSize(dtype) != itemsize) {
    return InvalidArgumentError(fmt::format("buffer format '{}' with item size {} is not {}",
                                            format, itemsize, DTypeName(dtype)));
  }
  return dtype;
}

StatusOr<MutableHostView> WritableViewFromPython(nb::handle object,
                                                 std::optional<DType> dtype_override,
                                                 std::string_view name,
                                                 std::shared_ptr<const void>* keep_alive) {
  auto held = std::make_unique<HeldBuffer>();
  if (!PyObject_CheckBuffer(object.ptr()) ||
      PyObject_GetBuffer(object.ptr(), &held->view, PyBUF_RECORDS) != 0) {
    PyErr_Clear();
    return InvalidArgumentError(
        fmt::format("{}: a {} is not writable memory with a buffer (a writable numpy array)", name,
                    nb::type_name(object.type()).c_str()));
  }
  held->acquired = true;
  const Py_buffer& buffer = held->view;
  bool big_endian = false;
  FERRY_ASSIGN_OR_RETURN(DType dtype, DTypeFromBufferFormat(buffer.format ? buffer.format : "B",
                                                            buffer.itemsize, &big_endian));
  if (big_endian) {
    return InvalidArgumentError(
        fmt::format("{}: big-endian memory; ferry writes in the host's byte order", name));
  }
  Dims dims(buffer.shape, buffer.shape + buffer.ndim);
  Dims strides = buffer.strides ? Dims(buffer.strides, buffer.strides + buffer.ndim)
                                : RowMajorByteStrides(dims, buffer.itemsize);
  MutableHostView view(buffer.buf, dtype, std::move(dims), std::move(strides));
  if (dtype_override.has_value()) {
    if (DTypeSize(*dtype_override) != DTypeSize(view.dtype)) {
      return InvalidArgumentError(fmt::format("{}: cannot write {} elements as {}", name,
                                              DTypeName(view.dtype), DTypeName(*dtype_override)));
    }
    view.dtype = *dtype_override;
  }
  FERRY_RETURN_IF_ERROR(view.ComputeAddressedBytes(name).status());
  *keep_alive = MakeKeepAlive(std::move(held));
  return view;
}

namespace {

// A PyCapsule handed to a put: DLPack 0.x's "dltensor" is imported as it is. A DLPack 1.x
// "dltensor_versioned" capsule, or a capsule whose tensor a consumer has taken already
// ("used_dltensor...": its memory may be gone), is refused with what to pass instead.
Status CheckImportableCapsule(nb::handle capsule, const std::string& name) {
  const char* raw = PyCapsule_GetName(capsule.ptr());
  if (raw == nullptr) PyErr_Clear();
  const std::string_view capsule_name = raw != nullptr ? raw : "";
  if (capsule_name == "dltensor") return OkStatus();
  if (capsule_name.starts_with("used_")) {
    return InvalidArgumentError(fmt::format(
        "tensor '{}': a DLPack capsule whose tensor has been taken already (a capsule is "
        "consumed once); pass the tensor itself, whose __dlpack__ ferry calls",
        name));
  }
  if (capsule_name == "dltensor_versioned") {
    return InvalidArgumentError(fmt::format(
        "tensor '{}': a versioned DLPack capsule (DLPack 1.x, from __dlpack__(max_version=...)) "
        "is not taken as a capsule; pass the tensor itself, whose __dlpack__ ferry calls",
        name));
  }
  return InvalidArgumentError(fmt::format(
      "tensor '{}': a PyCapsule named '{}' is not a DLPack tensor", name, capsule_name));
}

}  // namespace

StatusOr<std::shared_ptr<const TensorSource>> SourceFromPython(nb::handle object,
                                                               std::optional<DType> dtype_override,
                                                               std::string name, bool* read_only) {
  // Buffer protocol first: numpy arrays and every other buffer, with real byte strides.
  if (PyObject_CheckBuffer(object.ptr())) {
    auto held = std::make_unique<HeldBuffer>();
    if (PyObject_GetBuffer(object.ptr(), &held->view, PyBUF_RECORDS_RO) == 0) {
      held->acquired = true;
      const Py_buffer& buffer = held->view;
      if (read_only != nullptr) *read_only = buffer.readonly != 0;
      bool big_endian = false;
      FERRY_ASSIGN_OR_RETURN(DType dtype, DTypeFromBufferFormat(buffer.format ? buffer.format : "B",
                                                                buffer.itemsize, &big_endian));
      Dims dims(buffer.shape, buffer.shape + buffer.ndim);
      Dims strides = buffer.strides ? Dims(buffer.strides, buffer.strides + buffer.ndim)
                                    : RowMajorByteStrides(dims, buffer.itemsize);
      HostView view(buffer.buf, dtype, std::move(dims), std::move(strides));
      // Big-endian arrays are read as they are: the copy-convert swaps them on the way.
      view.byte_swapped = big_endian;
      FERRY_RETURN_IF_ERROR(ApplyOverride(view, dtype_override, name));
      return BorrowFrom(std::move(view), MakeKeepAlive(std::move(held)), std::move(name));
    }
    PyErr_Clear();  // e.g. a dtype the buffer protocol cannot express: try DLPack
  }
  // DLPack producers (torch tensors, JAX arrays), imported without a copy.
  if (PyCapsule_CheckExact(object.ptr())) {
    // nanobind imports a bare "dltensor" capsule (DLPack 0.x); a versioned one, or one a
    // consumer has taken already, is refused here with what to pass instead.
    FERRY_RETURN_IF_ERROR(CheckImportableCapsule(object, name));
  }
  nb::ndarray<nb::ro, nb::device::cpu> array;
  if (!nb::try_cast(object, array)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': a {} is neither a buffer nor a CPU DLPack tensor", name,
                    nb::type_name(object.type()).c_str()));
  }
  if (read_only != nullptr) {
    const nb::object module = nb::getattr(object.type(), "__module__", nb::none());
    *read_only = !(nb::isinstance<nb::str>(module) &&
                   std::string_view(nb::str(module).c_str()).starts_with("torch"));
  }
  const nb::dlpack::dtype dl = array.dtype();
  FERRY_ASSIGN_OR_RETURN(DType dtype, DTypeFromDLPack(dl.code, dl.bits, dl.lanes));
  Dims dims(array.ndim()), strides(array.ndim());
  for (size_t i = 0; i < array.ndim(); ++i) {
    dims[i] = static_cast<int64_t>(array.shape(i));
    strides[i] = array.stride(i) * DTypeSize(dtype);
  }
  HostView view(array.data(), dtype, std::move(dims), std::move(strides));
  FERRY_RETURN_IF_ERROR(ApplyOverride(view, dtype_override, name));
  return BorrowFrom(std::move(view), MakeKeepAlive(std::make_unique<HeldNdarray>(std::move(array))),
                    std::move(name));
}

}  // namespace ferry::python
