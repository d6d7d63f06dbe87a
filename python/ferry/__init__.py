"""ferry: move tensors between host memory and devices directly.

Real byte strides, the element type converted once on the way, asynchronous transfers that keep
their source alive exactly as long as they read it, and no GIL deadlocks. See docs/python.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

# The pjrt backend finds PJRT plugins shipped by installed packages (xla-cpu-pjrt, a CUDA or TPU
# plugin) in these folders; set before the first pjrt client is created. FERRY_PJRT_PLUGIN (a
# path or a package name) picks one explicitly.
os.environ.setdefault(
    "FERRY_PJRT_SEARCH_PATH",
    os.pathsep.join(p for p in __import__("sys").path if p and os.path.isdir(p)),
)

from . import _ferry  # noqa: E402
from ._ferry import Device  # noqa: E402
from . import distributed  # noqa: E402


def _quiet_exit_with_daemon_threads() -> None:
    """At exit (atexit runs after the non-daemon threads were joined and before the daemon ones are
    frozen): when daemon threads still run, the objects they hold outlive the interpreter, and
    nanobind's leak report would call each of them a reference counting bug (docs/python.md, Exit).
    A normal exit keeps the report, so that a real leak is still seen."""
    current = threading.current_thread()
    # threading.enumerate() misses threads started with _thread.start_new_thread; every thread
    # that still runs Python code has a frame in sys._current_frames().
    if (any(t.daemon and t.is_alive() and t is not current for t in threading.enumerate())
            or len(sys._current_frames()) > 1):
        _ferry._set_leak_warnings(False)
    # jaxlib's pytree registry (a registered dataclass, flax and equinox modules) keeps the
    # modules of registered types, __main__ included, alive past finalisation: their globals'
    # ferry objects are JAX's to free, not leaks of ferry's.
    if "jaxlib" in sys.modules:
        _ferry._set_leak_warnings(False)


atexit.register(_quiet_exit_with_daemon_threads)

__version__: str = _ferry.__version__

__all__ = [
    "ALIGNMENT",
    "Array",
    "Device",
    "Error",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "HostRead",
    "InternalError",
    "InvalidArgumentError",
    "Mesh",
    "Shard",
    "Sharding",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "TensorFile",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "empty",
    "device",
    "device_get",
    "device_put",
    "devices",
    "distributed",
    "global_devices",
    "make_array_from_process_local_data",
    "process_count",
    "process_index",
    "from_dlpack",
    "make_array_from_callback",
    "make_array_from_shards",
    "load_file",
    "metrics",
    "metrics_report",
    "open_file",
    "reset_metrics",
    "save_file",
    "set_setting",
    "settings",
    "shard_along",
]

# The package by concern; the public names (and the helpers that module.cc's Array methods call
# by name, `ferry._array_*`) are all here, each reporting "ferry" as its module.
from ._errors import (  # noqa: E402  (registers the error classes with the extension)
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from ._devices import device, devices, global_devices, process_count, process_index  # noqa: E402
from ._sharding import Mesh, Shard, Sharding, shard_along  # noqa: E402
from ._transfers import (  # noqa: E402
    device_get,
    device_put,
    from_dlpack,
    make_array_from_callback,
    make_array_from_process_local_data,
    make_array_from_shards,
)
from ._arrays import (  # noqa: E402
    ALIGNMENT,
    Array,
    HostRead,
    _array_array,
    _array_block_until_ready,
    _array_bool,
    _array_complex,
    _array_copy_to_host_async,
    _array_dlpack,
    _array_dtype,
    _array_float,
    _array_index,
    _array_int,
    _array_local_shards,
    _array_repr,
    _array_sharding,
    _array_to_numpy,
    _host_read_await,
    _reduce_array,
    _unpickle_array,
    empty,
)
from ._files import TensorFile, load_file, open_file, save_file  # noqa: E402
from ._settings import metrics, metrics_report, reset_metrics, set_setting, settings  # noqa: E402

# The Array methods written in Python (_arrays.py) are found through the package from C++, which
# holds it from now on: at exit, once sys.modules is emptied, a __del__ calling them still works.
_ferry._hold_package(sys.modules[__name__])

for _name in (*__all__, "_unpickle_array"):  # pickles and help() name them ferry.X
    _value = globals()[_name]
    if getattr(_value, "__module__", "").startswith("ferry._") and _value.__module__ != "ferry._ferry":
        _value.__module__ = "ferry"
del _name, _value
