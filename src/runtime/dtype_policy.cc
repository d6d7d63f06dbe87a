#include "ferry/runtime/dtype_policy.h"

#include "absl/types/span.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {
namespace {

// The types to try, in order, when the device does not hold `dtype`: the nearest first.
absl::Span<const DType> Fallbacks(DType dtype) {
  switch (dtype) {
    case DType::kF64: {
      static constexpr DType kFallbacks[] = {DType::kF32, DType::kBF16, DType::kF16};
      return kFallbacks;
    }
    case DType::kF32: {
      static constexpr DType kFallbacks[] = {DType::kF64, DType::kBF16, DType::kF16};
      return kFallbacks;
    }
    case DType::kF16:
    case DType::kBF16: {
      static constexpr DType kFallbacks[] = {DType::kF32, DType::kF64};
      return kFallbacks;
    }
    case DType::kC128: {
      static constexpr DType kFallbacks[] = {DType::kC64};
      return kFallbacks;
    }
    case DType::kC64: {
      static constexpr DType kFallbacks[] = {DType::kC128};
      return kFallbacks;
    }
    case DType::kS64: {
      static constexpr DType kFallbacks[] = {DType::kS32};
      return kFallbacks;
    }
    case DType::kU64: {
      static constexpr DType kFallbacks[] = {DType::kU32};
      return kFallbacks;
    }
    case DType::kS32: {
      static constexpr DType kFallbacks[] = {DType::kS64};
      return kFallbacks;
    }
    case DType::kU32: {
      static constexpr DType kFallbacks[] = {DType::kU64};
      return kFallbacks;
    }
    case DType::kS16: {
      static constexpr DType kFallbacks[] = {DType::kS32, DType::kS64};
      return kFallbacks;
    }
    case DType::kU16: {
      static constexpr DType kFallbacks[] = {DType::kU32, DType::kU64};
      return kFallbacks;
    }
    case DType::kS8: {
      static constexpr DType kFallbacks[] = {DType::kS16, DType::kS32};
      return kFallbacks;
    }
    case DType::kU8: {
      static constexpr DType kFallbacks[] = {DType::kU16, DType::kU32};
      return kFallbacks;
    }
    case DType::kBool: {
      static constexpr DType kFallbacks[] = {DType::kU8};
      return kFallbacks;
    }
    case DType::kF8E4M3FN:
    case DType::kF8E5M2:
      return {};
  }
  return {};
}

}  // namespace

StatusOr<DType> ChooseDeviceDType(DType source_dtype, std::optional<DType> requested,
                                  const DeviceCapabilities& capabilities,
                                  std::string_view tensor_name, bool* downcast) {
  DType chosen = source_dtype;
  if (requested.has_value()) {
    if (!capabilities.Holds(*requested)) {
      return InvalidArgumentError(
          fmt::format("tensor '{}': device dtype {} was requested but the device cannot hold it",
                      tensor_name, DTypeName(*requested)));
    }
    chosen = *requested;
  } else if (!capabilities.Holds(source_dtype)) {
    bool found = false;
    for (DType candidate : Fallbacks(source_dtype)) {
      if (capabilities.Holds(candidate)) {
        chosen = candidate;
        found = true;
        break;
      }
    }
    if (!found) {
      return InvalidArgumentError(
          fmt::format("tensor '{}': the device holds neither {} nor any type it converts to",
                      tensor_name, DTypeName(source_dtype)));
    }
  }
  if (downcast != nullptr) *downcast = DTypeSize(chosen) < DTypeSize(source_dtype);
  return chosen;
}

}  // namespace ferry
