// How a non-OK Status crosses into Python: C++ code of the extension throws a StatusError, and the
// translator registered in module.cc raises the ferry.Error subclass of its code (the classes are
// registered by ferry/_errors.py at import) with the Status message as the exception's text.
#pragma once

#include <utility>

#include "ferry/core/status.h"

namespace ferry::python {

// A non-OK Status on its way to Python.
struct StatusError {
  Status status;
};

template <typename T>
T ValueOrThrow(StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return *std::move(value);
}

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError{status};
}

}  // namespace ferry::python
