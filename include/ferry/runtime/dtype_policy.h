// The dtype policy: which dtype a device stores a source in.
#pragma once

#include <optional>

#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"

namespace ferry {

// An explicit `requested` dtype wins (InvalidArgument if the device cannot hold it).
// Otherwise the source dtype if the device holds it, else the nearest type the device holds:
// f64 -> f32, c128 -> c64, f16/bf16 -> f32, s64 -> s32, u64 -> u32, s16 -> s32, u16 -> u32,
// s8 -> s16/s32, u8 -> u16/u32, bool -> u8 (each in turn until one is held), and
// InvalidArgument naming the tensor when none is.
// Sets `*downcast` to true when the chosen type is narrower than the source (counted in
// SourceDowncasts by the runtime).
StatusOr<DType> ChooseDeviceDType(DType source_dtype, std::optional<DType> requested,
                                  const DeviceCapabilities& capabilities,
                                  std::string_view tensor_name, bool* downcast = nullptr);

}  // namespace ferry
