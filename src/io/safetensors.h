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
// The deepest JSON accepted, in levels of nesting (the outermost object is one level): deeper
// JSON is rejected before it costs anything. The valid structure is 3 levels deep, but unknown
// keys of an entry may hold anything, and serde_json, which the reference uses, accepts 127 levels
// and refuses 128 (its recursion limit counts down from 128 and fails on reaching 0).
inline constexpr int kSafetensorsMaxJsonDepth = 127;

// Parses and validates a whole safetensors file; every tensor borrows `file`.
StatusOr<ParsedTensors> ParseSafetensors(const std::shared_ptr<const MappedFile>& file);

}  // namespace ferry::io_internal
