"""ferry's exceptions: one class per status code of the C++ core, registered with the
extension so that its errors arrive as these classes."""

from __future__ import annotations

from . import _ferry


class Error(Exception):
    """Base class of every error ferry raises."""


class InvalidArgumentError(Error, ValueError):
    """An argument ferry cannot use: a bad dtype, shape, stride, sharding, name or file."""


class OutOfRangeError(Error, IndexError):
    """An index or range outside what it applies to."""


class NotFoundError(Error, LookupError):
    """Something named does not exist: a file, a device, a backend, a plugin."""


class ResourceExhaustedError(Error, MemoryError):
    """Out of device or host memory (or of a memory limit)."""


class PermissionDeniedError(Error, PermissionError):
    """The operating system refused access (a file)."""


class FailedPreconditionError(Error, RuntimeError):
    """The call does not fit the state: a deleted array, a client that is gone."""


class UnavailableError(Error, RuntimeError):
    """A backend that cannot start here (no OpenCL runtime, no PJRT plugin)."""


class UnimplementedError(Error, NotImplementedError):
    """An operation this backend or dtype does not support."""


class CancelledError(Error, RuntimeError):
    """A transfer cancelled (its client shut down, or the call was interrupted)."""


class InternalError(Error, RuntimeError):
    """A bug in ferry or in a device runtime: please report it."""


class DataLossError(Error, RuntimeError):
    """Data that was read is not what it should be (a tensor file truncated while mapped)."""


class UnknownError(Error, RuntimeError):
    """An error of no known kind (a device runtime's error ferry could not classify)."""


class DeadlineExceededError(Error, TimeoutError):
    """A multi-process collective call waited longer than FERRY_DISTRIBUTED_TIMEOUT_S."""


class AlreadyExistsError(Error, FileExistsError):
    """Something to be created exists already."""


class AbortedError(Error, RuntimeError):
    """An operation aborted by a conflict (a device runtime's ABORTED)."""


class UnauthenticatedError(Error, PermissionError):
    """A device runtime refused the caller's credentials."""


# absl::StatusCode values.
_ERROR_CLASSES = {
    1: CancelledError,
    2: UnknownError,
    4: DeadlineExceededError,
    3: InvalidArgumentError,
    5: NotFoundError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    11: OutOfRangeError,
    12: UnimplementedError,
    13: InternalError,
    14: UnavailableError,
    15: DataLossError,
    6: AlreadyExistsError,
    10: AbortedError,
    16: UnauthenticatedError,
}
for _code, _cls in _ERROR_CLASSES.items():
    _ferry._register_error(_code, _cls)
_ERROR_CODES = {_cls: _code for _code, _cls in _ERROR_CLASSES.items()}
