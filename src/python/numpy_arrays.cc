#include "src/python/numpy_arrays.h"

#include <vector>

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

nb::object ToNumpy(HostTensor tensor) {
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  std::vector<size_t> shape(owned->dims().begin(), owned->dims().end());
  nb::ndarray<nb::numpy> array(owned->data(), shape.size(), shape.data(), owner, nullptr,
                               StorageDLPackDType(owned->dtype()));
  return nb::cast(array, nb::rv_policy::reference);
}

nb::object ReadOnlyNumpyView(std::shared_ptr<const TensorSource> source) {
  const HostView& view = source->view();
  const int64_t element_size = view.element_size();
  std::vector<size_t> shape(view.dims.begin(), view.dims.end());
  std::vector<int64_t> strides;  // numpy's, through DLPack: in elements
  for (int64_t byte_stride : view.byte_strides) {
    if (byte_stride % element_size != 0) {
      throw StatusError{InvalidArgumentError(
          fmt::format("tensor '{}': byte stride {} is not a multiple of the element size {}",
                      source->name(), byte_stride, element_size))};
    }
    strides.push_back(byte_stride / element_size);
  }
  const void* data = view.data;
  const nb::dlpack::dtype dtype = StorageDLPackDType(view.dtype);
  auto* held = new std::shared_ptr<const TensorSource>(std::move(source));
  nb::capsule owner(
      held, [](void* p) noexcept { delete static_cast<std::shared_ptr<const TensorSource>*>(p); });
  nb::ndarray<nb::numpy, nb::ro> array(data, shape.size(), shape.data(), owner, strides.data(),
                                       dtype);
  return nb::cast(array, nb::rv_policy::reference);
}

}  // namespace ferry::python
