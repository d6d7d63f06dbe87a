// Strict UTF-8 validation (as Rust's `str::from_utf8`, which the safetensors reference uses):
// no overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequences. And the one
// way the readers quote text taken from a file in an error message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::io_internal {

// The offset of the first byte that does not start a valid UTF-8 sequence, or -1 when all of
// `text` is valid.
int64_t FindInvalidUtf8(std::string_view text);

// The length of the valid UTF-8 sequence that starts `text` (1 to 4), or 0 when `text` is empty
// or does not start with one.
int Utf8SequenceLength(std::string_view text);

// The character that starts non-empty `text`: its code point and its length in bytes. A byte that
// does not start a valid sequence is a character of its own, numbered above U+10FFFF
// (0x110000 + the byte) so that it equals no real character.
struct Utf8Character {
  uint32_t code_point = 0;
  int length = 0;
};
Utf8Character FirstCharacter(std::string_view text);

// `text` (UTF-8, possibly invalid) made safe to print inside a quoted error message: at most
// `max_characters` whole characters, then "..." when there were more. Printable characters stay as
// they are, non-ASCII ones included; a backslash is written `\\`; control characters (C0, DEL,
// C1), line and paragraph separators, bidirectional-text controls and U+FEFF are written `\n`,
// `\t`, `\r`, `\xNN` or `\uNNNN`; a byte that does not start a valid sequence is written `\xNN`.
// The result is always valid UTF-8 and never moves a terminal's cursor.
std::string EscapeForMessage(std::string_view text, size_t max_characters = 64);

}  // namespace ferry::io_internal
