#include "src/io/utf8.h"

#include "fmt/format.h"

namespace ferry::io_internal {
namespace {

// Characters that print nothing visible or rearrange what follows them on a terminal or in a log
// viewer: controls, line and paragraph separators, bidirectional controls, the byte-order mark.
bool NeedsEscape(uint32_t code_point) {
  return code_point < 0x20 || (code_point >= 0x7F && code_point <= 0x9F) || code_point == 0x061C ||
         code_point == 0x200E || code_point == 0x200F ||
         (code_point >= 0x2028 && code_point <= 0x202E) ||
         (code_point >= 0x2066 && code_point <= 0x2069) || code_point == 0xFEFF;
}

uint32_t DecodeCodePoint(std::string_view sequence) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(sequence.data());
  if (sequence.size() == 1) return bytes[0];
  static constexpr unsigned char kLeadMask[] = {0, 0, 0x1F, 0x0F, 0x07};
  uint32_t code_point = bytes[0] & kLeadMask[sequence.size()];
  for (size_t i = 1; i < sequence.size(); ++i) code_point = (code_point << 6) | (bytes[i] & 0x3F);
  return code_point;
}

}  // namespace

int Utf8SequenceLength(std::string_view text) {
  if (text.empty()) return 0;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char lead = bytes[0];
  if (lead < 0x80) return 1;
  int length;
  // The allowed range of the second byte narrows for the leads that could otherwise encode an
  // overlong form (E0, F0), a surrogate (ED) or a value above U+10FFFF (F4).
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return 0;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
  }
  if (text.size() < static_cast<size_t>(length)) return 0;
  if (bytes[1] < second_min || bytes[1] > second_max) return 0;
  for (int k = 2; k < length; ++k) {
    if (bytes[k] < 0x80 || bytes[k] > 0xBF) return 0;
  }
  return length;
}

Utf8Character FirstCharacter(std::string_view text) {
  const int length = Utf8SequenceLength(text);
  if (length == 0) return {0x110000u + static_cast<unsigned char>(text[0]), 1};
  return {DecodeCodePoint(text.substr(0, static_cast<size_t>(length))), length};
}

int64_t FindInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const int length = Utf8SequenceLength(text.substr(i));
    if (length == 0) return static_cast<int64_t>(i);
    i += static_cast<size_t>(length);
  }
  return -1;
}

std::string EscapeForMessage(std::string_view text, size_t max_characters) {
  std::string out;
  size_t i = 0;
  for (size_t characters = 0; i < text.size() && characters < max_characters; ++characters) {
    const int length = Utf8SequenceLength(text.substr(i));
    if (length == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[i]));
      ++i;
      continue;
    }
    const std::string_view sequence = text.substr(i, static_cast<size_t>(length));
    i += static_cast<size_t>(length);
    const uint32_t code_point = DecodeCodePoint(sequence);
    if (code_point == '\\') {
      out += "\\\\";
    } else if (code_point == '\n') {
      out += "\\n";
    } else if (code_point == '\r') {
      out += "\\r";
    } else if (code_point == '\t') {
      out += "\\t";
    } else if (code_point < 0x80 && NeedsEscape(code_point)) {
      out += fmt::format("\\x{:02x}", code_point);
    } else if (NeedsEscape(code_point)) {
      out += fmt::format("\\u{:04x}", code_point);
    } else {
      out += sequence;
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

}  // namespace ferry::io_internal
