// Strict UTF-8 validation (as Rust's `str::from_utf8`, which the safetensors reference uses):
// no overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequences.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry::io_internal {

// The offset of the first byte that does not start a valid UTF-8 sequence, or -1 when all of
// `text` is valid.
int64_t FindInvalidUtf8(std::string_view text);

}  // namespace ferry::io_internal
