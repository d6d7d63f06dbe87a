// The safetensors format (huggingface/safetensors): reader rules in docs/files.md.
#pragma once

#include <cstdint>
#include <memory>

#include "ferry/core/status.h"
#include "ferry/io/mapped_file.h"
#include "src/io/stored_tensor.h"

namespace ferry::io_internal {

// The largest JSON header the reference implementation accepts.
inline constexpr int64_t kSafetensorsMaxHeaderSize = 100'000'000;
// Deeper JSON is rejected before it costs anything (the valid structure is 3 levels deep;
// serde_json, which the reference uses, stops at 128 as well).
inline constexpr int kSafetensorsMaxJsonDepth = 128;

// Parses and validates a whole safetensors file; every tensor borrows `file`.
StatusOr<ParsedTensors> ParseSafetensors(const std::shared_ptr<const MappedFile>& file);

}  // namespace ferry::io_internal
