#include "src/plugin/plugin_types.h"

#include "src/device/pjrt/pjrt_client.h"

namespace ferry::plugin {

bool IsKnownPjrtType(int64_t value) {
  // The last enumerator of ferry's header (API 0.81).
  constexpr int64_t kLastType = PJRT_Buffer_Type_F4E2M1FN;
  return value > PJRT_Buffer_Type_INVALID && value <= kLastType && value != PJRT_Buffer_Type_TOKEN;
}

std::optional<DType> FromPjrtType(PJRT_Buffer_Type type) {
  for (int index = 0; index < kNumDTypes; ++index) {
    const auto dtype = static_cast<DType>(index);
    if (pjrt::ToPjrtType(dtype) == type) return dtype;
  }
  return std::nullopt;
}

}  // namespace ferry::plugin
