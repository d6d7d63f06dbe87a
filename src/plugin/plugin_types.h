// The element types ferry's plugin reads from its callers.
#pragma once

#include <cstdint>
#include <optional>

#include "ferry/core/dtype.h"
#include "pjrt_c_api.h"

namespace ferry::plugin {

// True for the element types of ferry's header that hold data: PRED up to the last type the
// header names, without TOKEN. The XLA plugins crash on INVALID, TOKEN and values outside the
// enum, so nothing else reaches them. (A type newer than ferry's header is refused too, even where
// a newer wrapped plugin would know it.)
// `value` is the raw integer the caller stored (a value outside the enum may not be read as one).
bool IsKnownPjrtType(int64_t value);

// The ferry dtype of `type` (the inverse of the pjrt backend's ToPjrtType); nullopt for the
// types ferry has no dtype for (4-bit and 2-bit integers and floats, the other float8 variants):
// those pass through to the wrapped plugin.
std::optional<DType> FromPjrtType(PJRT_Buffer_Type type);

}  // namespace ferry::plugin
