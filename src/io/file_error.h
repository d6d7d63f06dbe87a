// Error helpers shared by the tensor file readers: every message about malformed input starts
// with the file (and, where there is one, the tensor or zip member) it is about.
#pragma once

#include <string>
#include <string_view>

#include "ferry/core/status.h"
#include "fmt/format.h"

namespace ferry::io_internal {

// InvalidArgument "<context>: <message>", where `context` is for example "file 'a.npz': member
// 'w.npy'" (see FileContext / MemberContext).
inline Status MalformedError(std::string_view context, std::string_view message) {
  return InvalidArgumentError(fmt::format("{}: {}", context, message));
}

inline std::string FileContext(std::string_view file) { return fmt::format("file '{}'", file); }

inline std::string TensorContext(std::string_view file, std::string_view tensor) {
  return fmt::format("file '{}': tensor '{}'", file, tensor);
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
