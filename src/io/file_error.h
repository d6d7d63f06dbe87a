// Error helpers shared by the tensor file readers: every message about malformed input starts
// with the file (and, where there is one, the tensor or zip member) it is about.
#pragma once

#include <string>
#include <string_view>

#include "ferry/core/status.h"
#include "fmt/format.h"
#include "src/io/utf8.h"

namespace ferry::io_internal {

// InvalidArgument "<context>: <message>", where `context` is for example "file 'a.npz': member
// 'w.npy'" (see FileContext / MemberContext).
inline Status MalformedError(std::string_view context, std::string_view message) {
  return InvalidArgumentError(fmt::format("{}: {}", context, message));
}

// The longest file name and the longest tensor name quoted in a message, in characters.
inline constexpr size_t kQuotedPathLength = 4096;
inline constexpr size_t kQuotedNameLength = 256;

// Names are quoted through EscapeForMessage: a path need not be UTF-8, and a tensor name may hold
// any character, control characters included.
inline std::string FileContext(std::string_view file) {
  return fmt::format("file '{}'", EscapeForMessage(file, kQuotedPathLength));
}

inline std::string TensorContext(std::string_view file, std::string_view tensor) {
  return fmt::format("{}: tensor '{}'", FileContext(file),
                     EscapeForMessage(tensor, kQuotedNameLength));
}

inline std::string MemberContext(std::string_view file_context, std::string_view member) {
  return fmt::format("{}: member '{}'", file_context, EscapeForMessage(member, kQuotedNameLength));
}

// The message of `status` as a std::string_view (Debian's abseil has its own string_view type,
// which fmt cannot format).
inline std::string_view MessageOf(const Status& status) {
  return {status.message().data(), status.message().size()};
}

// Rewrites the message of a non-OK `status` as "<context>: <message>", keeping its code.
inline Status WithContext(const Status& status, std::string_view context) {
  if (status.ok()) return status;
  return Status(status.code(), fmt::format("{}: {}", context, MessageOf(status)));
}

}  // namespace ferry::io_internal
