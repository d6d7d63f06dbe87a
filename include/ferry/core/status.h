// Status and StatusOr: the error model of the C++ core.
//
// ferry uses abseil's `absl::Status` / `absl::StatusOr<T>` directly under shorter names; the
// C++ core never throws. Every error message names the tensor (or file, or device) and the
// problem, so a message can be shown to a user as it is.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

using absl::AbortedError;
using absl::CancelledError;
using absl::FailedPreconditionError;
using absl::InternalError;
using absl::InvalidArgumentError;
using absl::OkStatus;
using absl::OutOfRangeError;
using absl::ResourceExhaustedError;
using absl::UnavailableError;
using absl::UnimplementedError;

}  // namespace ferry

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function with the status of `expr` if it is not OK.
#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status ferry_status_ = (expr);         \
    if (!ferry_status_.ok()) return ferry_status_; \
  } while (false)

// `FERRY_ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns `x` from a StatusOr, or returns
// its error status from the enclosing function.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
