"""ferry: move tensors between host memory and devices directly.

Real byte strides, the element type converted once on the way, asynchronous transfers that keep
their source alive exactly as long as they read it, and no GIL deadlocks. See docs/python.md.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

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
    if any(t.daemon and t.is_alive() and t is not current for t in threading.enumerate()):
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
    "DeadlineExceededError",
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

_SEMANTICS = ("copy", "async", "zero_copy")


_NPY_USERDEF = 256  # numpy's first type number of a user-defined dtype


class _DtypeTable(Mapping):
    """ferry's dtype names (its canonical ones, in this order) -> numpy dtypes.

    bfloat16 and the float8s are ml_dtypes' numpy dtypes; ml_dtypes is imported the first time one
    of them is asked for (importing it takes about 0.5 s, as long as the rest of `import ferry`
    with numpy ten times over), so a process that never meets them in numpy (a torch or JAX
    caller, the `ferry` command) does not pay for it. ml_dtypes' are numpy user-defined dtypes
    (type numbers from NPY_USERDEF, 256, on), so lookups by dtype import it only for those.
    """

    _BUILTIN = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128")
    # Types numpy's buffer protocol cannot express travel as unsigned ints of their size.
    _ML_DTYPE_CARRIERS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8,
                          "float8_e5m2": np.uint8}

    def __init__(self) -> None:
        self._dtypes = {name: np.dtype(name) for name in self._BUILTIN}
        self.builtin = frozenset(self._dtypes.values())  # numpy's own dtypes, native order
        self._names = self._BUILTIN + tuple(self._ML_DTYPE_CARRIERS)
        self._viewed_as_uint: dict[np.dtype, tuple[str, type]] | None = None

    def _ml_dtypes(self) -> dict[np.dtype, tuple[str, type]]:
        if self._viewed_as_uint is None:
            import ml_dtypes

            viewed = {}
            for name, carrier in self._ML_DTYPE_CARRIERS.items():
                self._dtypes[name] = np.dtype(getattr(ml_dtypes, name))
                viewed[self._dtypes[name]] = (name, carrier)
            self._viewed_as_uint = viewed
        return self._viewed_as_uint

    def __getitem__(self, name: str) -> np.dtype:
        if name in self._ML_DTYPE_CARRIERS:
            self._ml_dtypes()
        return self._dtypes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def viewed_as_uint(self, dtype: np.dtype) -> tuple[str, type] | None:
        """(ferry's name, the unsigned carrier) for an ml_dtypes dtype; None for any other."""
        return self._ml_dtypes().get(dtype) if dtype.num >= _NPY_USERDEF else None

    def has(self, dtype: np.dtype) -> bool:
        """Whether ferry has this numpy dtype (in either byte order)."""
        dtype = dtype.newbyteorder("=")
        return dtype in self.builtin or self.viewed_as_uint(dtype) is not None

    def name_of(self, dtype: np.dtype) -> str | None:
        if dtype.num >= _NPY_USERDEF:
            viewed = self.viewed_as_uint(dtype)
            return None if viewed is None else viewed[0]
        for name in self._BUILTIN:
            if self._dtypes[name] == dtype:
                return name
        return None


_NUMPY_DTYPES = _DtypeTable()


def _dtype_name(dtype: Any) -> str:
    """ferry's name for a numpy dtype, an ml_dtypes type, a torch dtype (torch.bfloat16) or a
    name."""
    if isinstance(dtype, str) and dtype in _NUMPY_DTYPES:
        return dtype
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = str(dtype).removeprefix("torch.")
        name = {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)
        if name in _NUMPY_DTYPES:
            return name
        raise InvalidArgumentError(f"torch dtype {dtype} has no ferry equivalent")
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError as error:
        raise InvalidArgumentError(
            f"unknown dtype {dtype!r} (ferry's dtypes: {', '.join(_NUMPY_DTYPES)})") from error
    name = _NUMPY_DTYPES.name_of(numpy_dtype)
    if name is not None:
        return name
    raise InvalidArgumentError(f"dtype {numpy_dtype} has no ferry equivalent")


def _resolve_device(device: Device | str | None) -> Device | None:
    if device is None or isinstance(device, Device):
        return device
    if isinstance(device, str):
        return _ferry.device(device)
    raise InvalidArgumentError(f"device must be a ferry.Device, a name or None, not {device!r}")


def _resolve_lazy_views(x: Any) -> Any:
    """A torch view with the conjugate or negative bit set, made real (a copy).

    Such a view shares its storage with the tensor it was made from and records the conjugation
    or negation in a bit that DLPack cannot carry: read through DLPack it would arrive as the raw
    storage, unconjugated or unnegated.
    """
    for flag, resolve in (("is_conj", "resolve_conj"), ("is_neg", "resolve_neg")):
        check = getattr(x, flag, None)
        if callable(check) and check():
            x = getattr(x, resolve)()
    return x


def _has_buffer(x: Any) -> bool:
    try:
        memoryview(x)
    except TypeError:
        return False
    return True


def _check_movable(x: Any, where: str) -> None:
    """An error naming the real cause for inputs that cannot be moved (instead of the DLPack or
    buffer error they would raise further down)."""
    is_deleted = getattr(x, "is_deleted", None)
    if type(x).__module__.startswith("jax") and callable(is_deleted) and is_deleted():
        raise InvalidArgumentError(f"{where}: the jax array has been deleted (donated or .delete())")
    if type(x).__module__ == "torch" and type(x).__name__ in ("Tensor", "Parameter"):
        if getattr(x, "is_meta", False):
            raise InvalidArgumentError(f"{where}: a meta torch tensor has no data to move")
        layout = str(getattr(x, "layout", "torch.strided"))
        if layout != "torch.strided":
            raise InvalidArgumentError(
                f"{where}: a torch tensor with layout {layout} cannot be moved: make it dense "
                "first (.to_dense())")


# DLPack's device types (DLDeviceType), for errors.
_DLPACK_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                        9: "VPI", 10: "ROCM", 11: "ROCMHost", 13: "CUDAManaged", 14: "OneAPI"}


def _check_foreign_dtype(x: Any, where: str) -> None:
    """An error naming the dtype for a framework's array (JAX, torch) of a dtype ferry lacks
    (int4, float8_e4m3fnuz...), as numpy arrays get, instead of the DLPack error further down."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or isinstance(x, np.ndarray):
        return
    module = type(x).__module__.split(".")[0]
    framework = {"jaxlib": "jax"}.get(module, module)
    if type(dtype).__module__ == "torch":
        try:
            _dtype_name(dtype)
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"{where}: torch dtype {str(dtype).removeprefix('torch.')} has no ferry dtype "
                f"(ferry has {', '.join(_NUMPY_DTYPES)})") from None
        return
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError:
        return  # not a dtype numpy knows: let the buffer or DLPack path say what it can
    if not _NUMPY_DTYPES.has(numpy_dtype):
        raise InvalidArgumentError(
            f"{where}: {framework} dtype {numpy_dtype} has no ferry dtype (ferry has "
            f"{', '.join(_NUMPY_DTYPES)})")


def _check_dlpack_device(x: Any, where: str) -> None:
    """An error naming the device of a DLPack producer whose memory is not host memory (a CUDA
    torch tensor): ferry imports host (CPU) DLPack tensors only."""
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return
    get_device = getattr(x, "__dlpack_device__", None)
    if not callable(get_device):
        return
    try:
        device_type, device_id = get_device()
    except Exception:  # noqa: BLE001 - a producer that cannot say: the import will
        return
    if int(device_type) != _DLPACK_CPU:
        name = _DLPACK_DEVICE_NAMES.get(int(device_type), f"device type {int(device_type)}")
        raise InvalidArgumentError(
            f"{where}: a {type(x).__name__} in {name}:{device_id} memory: ferry imports DLPack "
            "tensors in host (CPU) memory only; copy it to the host first (torch: .cpu())")


def _prepare(x: Any, where: str = "the array") -> tuple[Any, str | None]:
    """The object ferry reads, and a dtype override when numpy cannot describe the dtype itself.
    `where` names the input in errors ("item 3")."""
    if type(x) is not np.ndarray:  # numpy arrays (a file's tensors) skip the other inputs' checks
        x = _prepare_other(x, where)
    viewed = _NUMPY_DTYPES.viewed_as_uint(x.dtype) if isinstance(x, np.ndarray) else None
    if viewed is not None:
        return x.view(viewed[1]), viewed[0]
    if isinstance(x, np.ndarray) and not _NUMPY_DTYPES.has(x.dtype):
        raise InvalidArgumentError(
            f"{where}: numpy dtype {x.dtype} has no ferry dtype (ferry has "
            f"{', '.join(_NUMPY_DTYPES)})")
    return x, None


def _prepare_other(x: Any, where: str) -> Any:
    """_prepare for what is not a plain numpy array: scalars, framework arrays, ferry.Arrays,
    objects numpy alone can read; checked, and made readable where it must be."""
    if isinstance(x, (np.generic, bool, int, float, complex)):  # a scalar: a 0-d array
        x = np.asarray(x)
    _check_movable(x, where)
    x = _resolve_lazy_views(x)
    if isinstance(x, Array):
        if x.is_deleted():
            raise InvalidArgumentError(f"{where}: a ferry.Array that has been deleted")
        x = x.to_numpy()  # through the host (device_put copies device to device where it can)
    _check_foreign_dtype(x, where)
    _check_dlpack_device(x, where)
    if (not isinstance(x, np.ndarray) and not hasattr(x, "__dlpack__") and not _has_buffer(x)
            and (hasattr(x, "__array__") or hasattr(x, "__array_interface__"))):
        x = np.asarray(x)  # an object that numpy alone can read
    return x


def _flatten(tree: Any, leaves: list[Any]) -> Callable[[Iterator[Any]], Any]:
    """Appends the leaves of a pytree (nested lists, tuples, named tuples and dicts; anything else
    is a leaf; None is an empty subtree, as in JAX: no leaf, rebuilt as None) to `leaves`, in
    order; returns the function that rebuilds the same structure from an iterator over new
    leaves."""
    if tree is None:
        return lambda it: None
    if isinstance(tree, dict):
        keys = list(tree)
        builders = [_flatten(tree[key], leaves) for key in keys]
        return lambda it: type(tree)(zip(keys, [build(it) for build in builders]))
    if isinstance(tree, (list, tuple)):
        builders = [_flatten(item, leaves) for item in tree]
        if hasattr(tree, "_fields"):  # a named tuple
            return lambda it: type(tree)(*[build(it) for build in builders])
        return lambda it: type(tree)([build(it) for build in builders])
    leaves.append(tree)
    return lambda it: next(it)


def _leaf_device_dtypes(tree: Any, dtypes: Any, out: list[Any], path: str) -> None:
    """Appends to `out` the device dtype of each leaf of `tree`, in _flatten's order: `dtypes` is
    one dtype (or None) for the whole subtree, or a pytree of the same structure, its dicts
    matched by key (as JAX matches a prefix tree), never by position."""
    where = f" at {path}" if path else ""
    if tree is None:
        return  # an empty subtree: no leaf to give a dtype
    if not isinstance(dtypes, (list, tuple, dict)):
        leaves: list[Any] = []
        _flatten(tree, leaves)
        out.extend([dtypes] * len(leaves))
        return
    if isinstance(tree, dict):
        if not isinstance(dtypes, dict):
            raise InvalidArgumentError(
                f"device_dtype{where} is a {type(dtypes).__name__} where the input has a dict: "
                "give one dtype, or a dict with the same keys")
        if set(dtypes) != set(tree):
            missing = [k for k in tree if k not in dtypes]
            extra = [k for k in dtypes if k not in tree]
            raise InvalidArgumentError(
                f"device_dtype{where} has other keys than the input: missing {missing}, "
                f"unknown {extra}")
        for key in tree:
            _leaf_device_dtypes(tree[key], dtypes[key], out, f"{path}[{key!r}]")
        return
    if isinstance(tree, (list, tuple)):
        if not isinstance(dtypes, (list, tuple)):
            raise InvalidArgumentError(
                f"device_dtype{where} is a dict where the input has a {type(tree).__name__}: "
                "give one dtype, or a sequence of the same length")
        if len(dtypes) != len(tree):
            raise InvalidArgumentError(
                f"device_dtype{where} has {len(dtypes)} {'entry' if len(dtypes) == 1 else 'entries'} "
                f"for {len(tree)} arrays: give one dtype, or one per array in the same structure")
        for index, (item, item_dtypes) in enumerate(zip(tree, dtypes)):
            _leaf_device_dtypes(item, item_dtypes, out, f"{path}[{index}]")
        return
    raise InvalidArgumentError(
        f"device_dtype{where} is a {type(dtypes).__name__} for one array: give one dtype")


class Mesh:
    """Devices in an n-d grid with named axes; `devices` are listed in row-major grid order."""

    def __init__(self, devices: Sequence[Device | str], shape: Sequence[int], axis_names: Sequence[str]):
        resolved = [_resolve_device(d) for d in devices]
        needed = math.prod(int(n) for n in shape)
        if 0 < len(resolved) < needed and all(d.name.startswith("host:") for d in resolved):
            raise InvalidArgumentError(
                f"mesh shape {[int(n) for n in shape]} needs {needed} devices, got "
                f"{len(resolved)}: {_ferry._device_count_hint('host')}")
        self._mesh = _ferry._Mesh(resolved, [int(n) for n in shape], [str(a) for a in axis_names])

    @property
    def devices(self) -> list[Device]:
        """The devices, in row-major grid order."""
        return list(self._mesh.devices)

    @property
    def shape(self) -> tuple[int, ...]:
        """The grid's size along each axis."""
        return tuple(self._mesh.shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """The axes' names, in the order of `shape`."""
        return tuple(self._mesh.axis_names)

    def __repr__(self) -> str:
        axes = ", ".join(f"{a}={n}" for a, n in zip(self.axis_names, self.shape))
        return f"ferry.Mesh({axes})"


class Sharding:
    """How a tensor is split over a Mesh: one spec entry per tensor dim, each a mesh axis name, a
    tuple of names (split over all of them, major to minor) or None (replicated). Mesh axes no
    entry names replicate the tensor over them. A spec shorter than a tensor's rank is padded with
    None, as jax.sharding.PartitionSpec is; a longer one is an error."""

    def __init__(self, mesh: Mesh, spec: Sequence[str | Sequence[str] | None]):
        if not isinstance(mesh, Mesh):
            raise InvalidArgumentError(f"Sharding needs a ferry.Mesh, not {type(mesh).__name__}")
        if isinstance(spec, str):
            spec = (spec,)  # one axis name: the first dimension split over that mesh axis
        if not isinstance(spec, Sequence):
            raise InvalidArgumentError(
                f"a Sharding spec is a sequence with one entry per tensor dimension (a mesh axis "
                f"name, a tuple of names or None), not {type(spec).__name__} {spec!r}")
        entries = []
        for dim, entry in enumerate(spec):
            names = [] if entry is None else [entry] if isinstance(entry, str) else entry
            if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
                raise InvalidArgumentError(
                    f"Sharding spec entry {dim} is {entry!r}: each entry is a mesh axis name "
                    f"(one of {list(mesh.axis_names)}), a tuple of names or None")
            entries.append(list(names))
        self.mesh = mesh
        self.spec = tuple(spec)
        self._sharding = _ferry._Sharding(mesh._mesh, entries)

    def shard_indices(self, shape: Sequence[int]) -> list[tuple[slice, ...]]:
        """Each mesh device's index (a tuple of slices) into a tensor of `shape`, in mesh order."""
        return [
            tuple(slice(begin, end) for begin, end in ranges)
            for ranges in self._sharding.shard_indices([int(n) for n in shape])
        ]

    def __repr__(self) -> str:
        return f"ferry.Sharding({self.mesh!r}, spec={self.spec!r})"


@dataclass(frozen=True)
class Shard:
    """One mesh device's part of a sharded Array, read back to the host (an unsharded Array has
    one shard: all of it). `device_dtype` is what that device stores."""

    device: Device
    index: tuple[slice, ...]
    data: np.ndarray
    device_dtype: str | None = None


Array = _ferry.Array
Array.__module__ = "ferry"
HostRead = _ferry.HostRead
HostRead.__module__ = "ferry"


def _host_read_await(self: HostRead) -> Any:
    """HostRead.__await__ (defined on the class in module.cc): waits in a thread of the running
    event loop's default executor (the read itself needs no thread), then returns `out` or raises
    the read's error."""
    if not self.is_ready():
        import asyncio

        yield from asyncio.get_running_loop().run_in_executor(None, _wait_quietly, self).__await__()
    return self.wait()


def _wait_quietly(read: HostRead) -> None:
    """Waits for `read` and drops its error (raised by the wait that follows, on the caller)."""
    try:
        read.wait()
    except Error:
        pass


def _array_copy_to_host_async(self: Array, out: Any = None) -> HostRead | None:
    """Array.copy_to_host_async: see its docstring (module.cc)."""
    if out is None:
        self._start_host_copy()
        return None
    return _start_read_into(self, out, "copy_to_host_async")


def _array_dtype(self: Array) -> np.dtype:
    """The logical dtype (the source's), as a numpy dtype."""
    return _NUMPY_DTYPES[self._dtype_name]


def _array_bool(self: Array) -> bool:
    """numpy's rule: an array of one element is that element's truth; any other size is
    ambiguous (ValueError), rather than True for every non-empty array."""
    if self.size != 1:
        raise ValueError(
            f"The truth value of an array with {self.size} elements is ambiguous (numpy's rule: "
            "only a one-element array has one); use a.to_numpy().any() or .all()")
    return bool(self.to_numpy())


def _array_to_numpy(self: Array) -> np.ndarray:
    """The data as a new numpy array in the logical dtype (blocks without the GIL)."""
    return device_get(self)


def _array_block_until_ready(self: Array) -> Array:
    """Waits until every transfer into the array has finished (raising its error, if any);
    returns the array."""
    self._block_until_ready()
    return self


def _array_array(self: Array, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    """numpy's array protocol (numpy 2). Without a copy where numpy can read the data where it lies
    (an unsharded array in host-addressable memory, stored in its own dtype): a read-only view that
    keeps the device memory alive, even past `delete()`. copy=True (numpy.array's default) always
    copies; copy=None (numpy.asarray) copies only where a view is impossible; copy=False raises
    ValueError there, as the protocol requires."""
    if copy is not True:
        view, reason = self._numpy_view()
        if view is not None:
            logical = _NUMPY_DTYPES[self._dtype_name]
            if view.dtype != logical:  # bfloat16 and float8 are made as uints of their size
                view = view.view(logical)
            if dtype is None or np.dtype(dtype) == view.dtype:
                return view
            reason = f"it holds {view.dtype}, not the {np.dtype(dtype)} asked for"
        if copy is False:
            raise ValueError(
                f"numpy cannot use this ferry.Array without a copy (copy=False): {reason}; use "
                "numpy.asarray(a) or a.to_numpy() to copy")
    result = self.to_numpy()
    return result if dtype is None else result.astype(dtype, copy=False)


def _device_dtype_text(self: Array) -> str:
    """The device dtype, or each distinct one of the shards ("float16/float32") on a mesh whose
    devices store different ones."""
    names = list(dict.fromkeys(self.shard_device_dtypes))
    return "/".join(names)


def _array_repr(self: Array) -> str:
    if self.is_deleted():
        return "ferry.Array(<deleted>)"
    if self._is_sharded:
        return (
            f"ferry.Array(shape={self.shape}, dtype={self._dtype_name}, "
            f"device_dtype={_device_dtype_text(self)}, sharding={self.sharding!r}, "
            f"devices=[{', '.join(d.global_name for d in self.devices)}])"
        )
    return (
        f"ferry.Array(shape={self.shape}, dtype={self._dtype_name}, "
        f"device_dtype={self.device_dtype}, device={self.device.global_name})"
    )


def _reduce_array(array: Array) -> tuple[Any, tuple[Any, ...]]:
    """Array.__reduce__: through the host (the data as numpy), then put back where it was."""
    data = array.to_numpy()
    if array._is_sharded:
        sharding = array.sharding
        mesh = sharding.mesh
        placement = ([d.name for d in mesh.devices], mesh.shape, mesh.axis_names, sharding.spec)
    else:
        placement = array.device.name
    return _unpickle_array, (data, placement, array.shard_device_dtypes)


def _unpickle_array(data: np.ndarray, placement: Any, shard_device_dtypes: list[str]) -> Array:
    """Puts unpickled data back on the device (or mesh) of the same name(s), each device storing
    the dtype it stored before (when they all agreed; else each device's profile decides)."""
    dtypes = set(shard_device_dtypes)
    device_dtype = dtypes.pop() if len(dtypes) == 1 else None
    if isinstance(placement, str):
        return device_put(data, placement, device_dtype=device_dtype)
    names, shape, axis_names, spec = placement
    sharding = Sharding(Mesh(names, shape, axis_names), spec)
    return device_put(data, sharding, device_dtype=device_dtype)


def _array_dlpack(self: Array, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                  dl_device: Any = None, copy: bool | None = None) -> Any:
    """DLPack export of the array's device memory, zero-copy except over read-only host memory.

    Host devices, and pjrt devices whose memory ferry addresses directly (the CPU plugins:
    `device.description` says "direct host access"), export DLPack CPU tensors; a CUDA (or ROCm)
    PJRT plugin's arrays export its device memory as a kDLCUDA (kDLROCM) tensor of that GPU, so
    `torch.from_dlpack` and `jax.dlpack.from_dlpack` take them without a copy. The export waits
    until the array's transfer has completed, so the consumer's `stream` (any) sees the data.
    Devices whose memory has no address (opencl, a TPU) raise `ferry.UnimplementedError`.

    A consumer that passes `max_version` >= (1, 0) gets a versioned capsule, an older one an
    unversioned capsule. An array that aliases read-only memory (a zero_copy put of a mapped file
    or of a read-only array) is exported as a copy (flagged IS_COPIED), unless the consumer passes
    copy=False: then a versioned capsule flagged READ_ONLY aliases it, and an unversioned one
    (which cannot carry the flag) is refused with BufferError. Never a writable alias.
    """
    device_type, device_id = self.__dlpack_device__()
    if stream is not None and device_type == _DLPACK_CPU:
        raise BufferError("__dlpack__: a host-memory device has no streams; pass stream=None")
    if dl_device is not None and tuple(dl_device) != (device_type, device_id):
        raise BufferError(f"__dlpack__: cannot export to device {tuple(dl_device)}, only "
                          f"{(device_type, device_id)}, where the array is")
    major = 0 if max_version is None else int(max_version[0])
    return self._export_dlpack(major, copy)


_DLPACK_CPU = 1  # DLPack's kDLCPU


def _array_local_shards(self: Array) -> list[Shard]:
    """This process's shards (one per mesh device of this process, in mesh order) read back; all
    reads start before any wait. In one process: every shard. An unsharded array has one shard:
    all of it, on its device."""
    if not self._is_sharded:
        return [Shard(self.device, tuple(slice(0, n) for n in self.shape), self.to_numpy(),
                      self.device_dtype)]
    logical = _NUMPY_DTYPES[self._dtype_name]
    shards = []
    for (device, ranges, data), device_dtype in zip(self._local_shards(), self.shard_device_dtypes):
        if data.dtype != logical:
            data = data.view(logical)
        shards.append(Shard(device, tuple(slice(b, e) for b, e in ranges), data, device_dtype))
    return shards


def _array_sharding(self: Array) -> Sharding | None:
    """The ferry.Sharding of a sharded array; None for an array on one device."""
    return getattr(self, "_python_sharding", None) if self._is_sharded else None


# The Array methods above (`_array_*`) are defined on the class itself in src/python/module.cc,
# with their signatures and docstrings (help(ferry.Array), the _ferry.pyi stub).


def devices(backend: str | None = None) -> list[Device]:
    """This process's devices of `backend` ("host", "opencl", "pjrt"), or of every backend that can
    start here."""
    return _ferry.devices(backend)


def global_devices(backend: str = "host") -> list[Device]:
    """Every process's devices of `backend`, in process order (the position is `Device.id`): this
    process's own, and the others' as descriptions (`is_addressable` False) that a Mesh may hold.
    Collective the first time for each backend: every process must call it (after
    `ferry.distributed.initialize()`). In one process: `devices(backend)`."""
    return _ferry._global_devices(backend, _ferry.devices(backend))


def process_index() -> int:
    """This process's index in the job (0 in a single process)."""
    return _ferry.process_index()


def process_count() -> int:
    """The number of processes in the job (1 without MPI or before distributed.initialize())."""
    return _ferry.process_count()


Device.process_index = property(lambda self: _ferry._process_index_of(self),
                                doc="The index of the process that owns the device.")
Device.id = property(lambda self: _ferry._global_id_of(self, self.backend),
                     doc="The global id: the position in global_devices(backend).")
Device.is_addressable = property(lambda self: _ferry._remote_backend(self) is None,
                                 doc="False for a device of another process.")


def device(name: str) -> Device:
    """The device called `name`, e.g. "host:0"."""
    return _ferry.device(name)


def device_put(
    x: Any,
    device: Device | str | Sharding | None = None,
    *,
    device_dtype: Any = None,
    semantics: str = "copy",
    memory_kind: str | None = None,
) -> Any:
    """Puts `x` on `device`: one array, or every leaf of a pytree (nested lists, tuples and dicts
    of arrays, as JAX takes them) in one batched call, returned in the same structure.

    A leaf is a numpy array, a buffer-protocol object, a DLPack producer (a torch tensor, a JAX
    array), an object numpy can read (`__array__`, `__array_interface__`) or a Python scalar (a 0-d
    array). `device` may be a Sharding: then each mesh device gets its shard, sent from a strided
    view of `x` (no host copy). `device_dtype` asks the device to store another type (a name, a
    numpy, ml_dtypes or torch dtype), for every leaf, or per leaf as a pytree of the same structure
    (None: the device's profile decides); the result keeps each leaf's dtype as its logical dtype.
    `semantics` is "copy" (the default: `x` has been read when this returns), "async" (returns at
    once; ferry holds `x` until it has read it; do not change `x` meanwhile) or "zero_copy" (the
    host device may alias `x` for the array's life; otherwise as "async"). An input that cannot be
    moved raises an error naming the cause and, in a batch, the item's index. `memory_kind` picks
    the memory space (one of `device.memory_kinds`, e.g. "pinned_host" on a PJRT device; None: the
    device's default); a put into a non-default space reads `x` before it returns, whatever the
    semantics.
    """
    # The common call, one numpy array of a builtin dtype onto a device in its own dtype and
    # memory, goes straight to the put: no pytree, dtype or device-to-device work to do.
    if (type(x) is np.ndarray and device_dtype is None and memory_kind is None
            and (device is None or type(device) is Device) and semantics in _SEMANTICS
            and x.dtype in _NUMPY_DTYPES.builtin):
        return _ferry.put_one(x, device, semantics)
    return _device_put(x, device, device_dtype, semantics, memory_kind)


def _device_put(x: Any, device: Any, device_dtype: Any, semantics: str, memory_kind: str | None,
                tensor_names: list[str] | None = None) -> Any:
    """device_put; `tensor_names` (one per leaf) name the tensors in errors instead of their
    index ("item 3"), as load_file names them by the file's names."""
    if semantics not in _SEMANTICS:
        raise InvalidArgumentError(f"semantics must be one of {_SEMANTICS}, got {semantics!r}")
    items: list[Any] = []
    rebuild = _flatten(x, items)
    batched = not (len(items) == 1 and items[0] is x)
    if not items:
        return rebuild(iter(()))  # None, or a structure of Nones and empty containers
    if tensor_names is not None:
        labels = [f"tensor {name!r}" for name in tensor_names]
    else:
        tensor_names = [f"item {index}" for index in range(len(items))] if batched else None
        labels = tensor_names if batched else ["the array"]
    requested: list[Any] = []
    _leaf_device_dtypes(x, device_dtype, requested, "")
    names = [None if d is None else _dtype_name(d) for d in requested]
    target = device if isinstance(device, Sharding) else _resolve_device(device)
    # ferry.Arrays that can be copied device to device (Buffer::CopyToDevice) are; the others
    # (sharded, to a Sharding or a memory kind, another device dtype) go through the host.
    copied = [index for index, item in enumerate(items)
              if _copies_device_to_device(item, target, names[index], memory_kind, labels[index])]
    objects, overrides, put_indices = [], [], []
    for index, item in enumerate(items):
        if index in copied:
            continue
        obj, override = _prepare(item, labels[index])
        objects.append(obj)
        overrides.append(override)
        put_indices.append(index)
    if isinstance(target, Sharding):
        if batched:
            raise InvalidArgumentError("device_put with a Sharding takes one array, not a list")
        array = _ferry.put_sharded(objects[0], overrides[0], target._sharding, names[0], semantics,
                                   memory_kind)
        return _with_sharding(array, target)
    arrays: list[Any] = [None] * len(items)
    if copied:
        for index, array in zip(copied, _ferry.copy_to_device([items[i] for i in copied], target)):
            arrays[index] = array
    if put_indices:
        put = _ferry.put_each(objects, overrides, target, [names[i] for i in put_indices],
                              semantics, memory_kind,
                              None if tensor_names is None else [tensor_names[i] for i in put_indices])
        for index, array in zip(put_indices, put):
            arrays[index] = array
    return rebuild(iter(arrays)) if batched else arrays[0]


def _copies_device_to_device(item: Any, target: Any, device_dtype: str | None,
                             memory_kind: str | None, where: str) -> bool:
    """Whether device_put copies `item` device to device: an unsharded ferry.Array put on one
    device, in its default memory, storing the same dtype, which the target holds."""
    if not isinstance(item, Array):
        return False
    if item.is_deleted():
        raise InvalidArgumentError(f"{where}: a ferry.Array that has been deleted")
    if isinstance(target, Sharding) or item._is_sharded or memory_kind is not None:
        return False
    if device_dtype is not None and device_dtype != item.device_dtype:
        return False
    target = target if target is not None else _ferry.device("host:0")
    return item.device_dtype in target.dtypes


def _with_sharding(array: Array, sharding: Sharding) -> Array:
    array._python_sharding = sharding
    return array


def make_array_from_shards(
    shape: Sequence[int],
    sharding: Sharding,
    arrays: Sequence[Any],
    *,
    device_dtype: Any = None,
    semantics: str = "copy",
    dtype: Any = None,
) -> Array:
    """A sharded Array from one host array per mesh device (in mesh order), each of exactly its
    shard's shape (see Sharding.shard_indices). Entries for other processes' devices are ignored
    (pass None); `dtype` names the array's dtype where this process holds no shard."""
    if dtype is not None:
        dtype = _dtype_name(dtype)
    if semantics not in _SEMANTICS:
        raise InvalidArgumentError(f"semantics must be one of {_SEMANTICS}, got {semantics!r}")
    prepared = [(None, None) if a is None else _prepare(a) for a in arrays]
    name = None if device_dtype is None else _dtype_name(device_dtype)
    array = _ferry.make_from_shards(
        [int(n) for n in shape], sharding._sharding, [p[0] for p in prepared],
        [p[1] for p in prepared], name, semantics, dtype)
    return _with_sharding(array, sharding)


def make_array_from_callback(
    shape: Sequence[int],
    sharding: Sharding,
    callback: Callable[[tuple[slice, ...]], Any],
    *,
    device_dtype: Any = None,
    semantics: str = "copy",
    dtype: Any = None,
) -> Array:
    """A sharded Array whose shards come from `callback(index)` (a tuple of slices), called once
    per mesh device of this process, in mesh order (never for another process's devices): e.g. to
    load a checkpoint shard by shard."""
    shards = [
        callback(index) if device.is_addressable else None
        for device, index in zip(sharding.mesh.devices, sharding.shard_indices(shape))
    ]
    return make_array_from_shards(shape, sharding, shards, device_dtype=device_dtype,
                                  semantics=semantics, dtype=dtype)


def _local_extents(sharding: Sharding, shape: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Per dim, the sorted distinct (begin, end) ranges that this process's devices hold."""
    indices = sharding.shard_indices(shape)
    local = [index for device, index in zip(sharding.mesh.devices, indices) if device.is_addressable]
    return [sorted({(index[d].start, index[d].stop) for index in local}) for d in range(len(shape))]


def make_array_from_process_local_data(
    sharding: Sharding,
    local_data: Any,
    global_shape: Sequence[int] | None = None,
) -> Array:
    """A global Array from each process's own part (JAX's meaning): `local_data` holds, along each
    dim, the data of the distinct shard ranges this process's devices hold, in order (a dim that
    is not split, or split only within this process, is whole). Every process calls it with its
    own part. `global_shape` defaults to the local shape scaled by how many distinct ranges each
    dim has globally versus here (it must divide evenly; pass it for uneven shapes)."""
    local = np.asarray(local_data)
    if global_shape is None:
        probe = [int(np.prod(sharding.mesh.shape))] * local.ndim  # every split divides it evenly
        all_ranges = [sorted({(i[d].start, i[d].stop) for i in sharding.shard_indices(probe)})
                      for d in range(local.ndim)]
        here = _local_extents(sharding, probe)
        global_shape = []
        for d, n in enumerate(local.shape):
            if not here[d]:
                raise InvalidArgumentError("make_array_from_process_local_data: this process has "
                                           "no device in the sharding's mesh; pass global_shape")
            if n % len(here[d]):
                raise InvalidArgumentError(
                    f"make_array_from_process_local_data: dim {d} of the local data ({n}) does "
                    f"not split evenly into this process's {len(here[d])} shard(s); pass "
                    "global_shape")
            global_shape.append(n // len(here[d]) * len(all_ranges[d]))
    global_shape = [int(n) for n in global_shape]
    if len(global_shape) != local.ndim:
        raise InvalidArgumentError(f"make_array_from_process_local_data: global_shape has rank "
                                   f"{len(global_shape)}, the local data {local.ndim}")
    extents = _local_extents(sharding, global_shape)
    for d, ranges in enumerate(extents):
        expected = sum(end - begin for begin, end in ranges)
        if ranges and local.shape[d] != expected:
            raise InvalidArgumentError(
                f"make_array_from_process_local_data: dim {d} of the local data is "
                f"{local.shape[d]}, but this process's shards of global shape {tuple(global_shape)} "
                f"cover {expected} along it")
    offsets = []  # per dim: shard begin -> offset in the local data
    for ranges in extents:
        offset, starts = 0, {}
        for begin, end in ranges:
            starts[begin] = offset
            offset += end - begin
        offsets.append(starts)

    def local_part(index: tuple[slice, ...]) -> np.ndarray:
        return local[tuple(slice(offsets[d][s.start], offsets[d][s.start] + s.stop - s.start)
                           for d, s in enumerate(index))]

    return make_array_from_callback(global_shape, sharding, local_part, dtype=local.dtype)


def device_get(x: Any, out: Any = None) -> Any:
    """The data of an Array as numpy, or of every Array in a pytree (nested lists, tuples and
    dicts; None leaves stay None), returned in the same structure: every read starts before any
    wait.

    `out` reads into the caller's memory instead: a writable numpy array of the array's shape and
    dtype (any strides: a transposed or sliced view is written in place), or a pytree of them
    matching `x` (dicts by key). Everything is checked before any read starts (a bad `out` raises
    `InvalidArgumentError` naming it, and nothing was written); returns `out`.
    """
    arrays: list[Any] = []
    rebuild = _flatten(x, arrays)
    batched = not (len(arrays) == 1 and arrays[0] is x)
    for index, item in enumerate(arrays):
        if not isinstance(item, Array):
            where = f"item {index} is" if batched else "not"
            raise InvalidArgumentError(
                f"device_get takes ferry.Array objects ({where} a {type(item).__name__})")
    if out is not None:
        return _start_read_into(x, out, "device_get").wait()
    raw = _ferry.get(arrays)
    results = []
    for array, data in zip(arrays, raw):
        logical = _NUMPY_DTYPES[array._dtype_name]
        results.append(data if data.dtype == logical else data.view(logical))
    return rebuild(iter(results)) if batched else results[0]


def _pair_out_leaves(tree: Any, out: Any, path: str, pairs: list[tuple[Any, Any, str]],
                     what: str) -> None:
    """Appends (array, out leaf, path) for each leaf of `tree`, in _flatten's order, matching `out`
    by structure (dicts by key, sequences by position)."""
    if tree is None:
        if out is not None:
            raise InvalidArgumentError(f"{what}: out{path} is a {type(out).__name__} where the "
                                       "input has None")
        return
    if isinstance(tree, dict):
        if not isinstance(out, dict) or set(out) != set(tree):
            raise InvalidArgumentError(
                f"{what}: out{path} must be a dict with the input's keys {list(tree)}, not "
                f"{list(out) if isinstance(out, dict) else type(out).__name__}")
        for key in tree:
            _pair_out_leaves(tree[key], out[key], f"{path}[{key!r}]", pairs, what)
        return
    if isinstance(tree, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(tree):
            got = f"{len(out)} entries" if isinstance(out, (list, tuple)) else type(out).__name__
            raise InvalidArgumentError(
                f"{what}: out{path} must be a list or tuple of {len(tree)} entries, as the "
                f"input, not {got}")
        for index, (item, item_out) in enumerate(zip(tree, out)):
            _pair_out_leaves(item, item_out, f"{path}[{index}]", pairs, what)
        return
    pairs.append((tree, out, path))


def _start_read_into(x: Any, out: Any, what: str) -> HostRead:
    """Checks `out` against the Arrays of `x` and starts reading each into its leaf of `out`."""
    pairs: list[tuple[Any, Any, str]] = []
    _pair_out_leaves(x, out, "", pairs, what)
    arrays, leaves, overrides = [], [], []
    seen: dict[int, str] = {}
    for array, leaf, path in pairs:
        where = f"out{path}"
        if not isinstance(leaf, np.ndarray):
            raise InvalidArgumentError(
                f"{what}: {where} is a {type(leaf).__name__}, not a numpy array")
        if not leaf.flags.writeable:
            raise InvalidArgumentError(f"{what}: {where} is read-only")
        if leaf.shape != array.shape:
            raise InvalidArgumentError(
                f"{what}: {where} has shape {leaf.shape}, the array {array.shape}")
        if leaf.dtype != array.dtype:
            raise InvalidArgumentError(
                f"{what}: {where} has dtype {leaf.dtype}, the array {array.dtype}: out must have "
                "the array's dtype")
        if id(leaf) in seen:
            raise InvalidArgumentError(
                f"{what}: {where} is the same numpy array as out{seen[id(leaf)]}: each array "
                "needs its own")
        seen[id(leaf)] = path
        viewed = _NUMPY_DTYPES.viewed_as_uint(leaf.dtype)
        arrays.append(array)
        leaves.append(leaf if viewed is None else leaf.view(viewed[1]))
        overrides.append(None if viewed is None else viewed[0])
    return _ferry.read_into(arrays, out, leaves, overrides, what)


def from_dlpack(obj: Any, device: Device | str | None = None) -> Array:
    """Imports a DLPack producer: one in host memory (a CPU torch tensor or JAX array, a numpy
    array) is put on `device` (default host:0) with semantics "zero_copy", so the host device
    aliases it without a copy where it can (`Array.is_alias`). A ferry.Array is taken as it is,
    without a copy (another Array over the same device data), when `device` is None or its own
    device; for another device it is copied there device to device (as `device_put`).
    Producers in device memory (a CUDA tensor) raise InvalidArgumentError naming the device."""
    if isinstance(obj, Array):
        if obj.is_deleted():
            raise InvalidArgumentError("from_dlpack: a ferry.Array that has been deleted")
        target = _resolve_device(device)
        if target is None or (not obj._is_sharded and target == obj.device):
            alias = obj._alias()
            return _with_sharding(alias, obj.sharding) if obj._is_sharded else alias
        return device_put(obj, target)
    return device_put(obj, device, semantics="zero_copy")


# --- tensor files (docs/files.md) ----------------------------------------------------------------

_FILE_FORMATS = {".safetensors": "safetensors", ".npy": "npy", ".npz": "npz"}


class TensorFile(Mapping):
    """A safetensors, .npy or .npz file opened by `open_file`: a read-only mapping from tensor
    name to numpy array, in the file's order (safetensors: by data offset; .npz: archive order).

    Arrays are read-only. Where `zero_copy(name)` is True the array is a view of the mapped file
    (no copy was made); otherwise (deflated .npz members, big-endian .npy data) it views a copy
    decoded once at open time. Every array holds what it views: the arrays stay valid after this
    object is gone, and the file is unmapped when the last of them is gone. Copy an array
    (`np.array(a)`) to get a writable one that does not hold the file.
    """

    def __init__(self, path: str, format: str, metadata: dict[str, str],
                 entries: list[tuple[str, np.ndarray, bool, bool]]):
        self._path = path
        self._format = format
        self._metadata = dict(metadata)
        self._arrays = {name: array for name, array, _, _ in entries}
        self._zero_copy = {name: zero_copy for name, _, zero_copy, _ in entries}
        self._byte_swapped = {name: swapped for name, _, _, swapped in entries}

    @property
    def path(self) -> str:
        """The path the file was opened from."""
        return self._path

    @property
    def format(self) -> str:
        """"safetensors", "npy" or "npz" (detected from the file's first bytes)."""
        return self._format

    @property
    def metadata(self) -> dict[str, str]:
        """safetensors' `__metadata__` (empty for numpy files)."""
        return dict(self._metadata)

    def zero_copy(self, name: str) -> bool:
        """Whether tensor `name` is a view of the mapped file rather than of a decoded copy."""
        return self._zero_copy[name]

    def byte_swapped(self, name: str) -> bool:
        """Whether the file stored tensor `name` big-endian (the array holds swapped values)."""
        return self._byte_swapped[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"ferry.TensorFile({self._path!r}, format={self._format}, tensors={len(self)})"


def _string_list(value: str | Iterable[str] | None, argument: str) -> list[str]:
    """names=, pattern=, exclude=: one string, or any iterable of strings (a bare string is one
    name, never its characters)."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else list(value)
    for each in values:
        if not isinstance(each, str):
            raise TypeError(f"{argument}= takes strings, not {type(each).__name__}")
    return values


def open_file(path: str | os.PathLike, *, names: str | Iterable[str] | None = None,
              pattern: str | Iterable[str] | None = None,
              exclude: str | Iterable[str] | None = None) -> TensorFile:
    """Maps and validates a safetensors, .npy or .npz file (the format comes from its first bytes)
    and returns its tensors as read-only numpy arrays, without copying little-endian data.

    `names`, `pattern` and `exclude` choose tensors (see `load_file`); the others are not read.

    Malformed files raise InvalidArgumentError with a message that names the file, the tensor
    and the broken rule; file-system errors raise NotFoundError, PermissionDeniedError, ...
    A name or pattern that matches no tensor raises NotFoundError naming it.
    The GIL is released while the file is opened and parsed.
    """
    path = os.fspath(path)
    format_name, metadata, raw = _ferry._load_file(
        path, _string_list(names, "names"), _string_list(pattern, "pattern"),
        _string_list(exclude, "exclude"))
    entries = []
    for name, data, dtype_name, zero_copy, byte_swapped in raw:
        logical = _NUMPY_DTYPES[dtype_name]
        if byte_swapped:  # big-endian data, viewed as it lies in the file (still zero-copy)
            logical = logical.newbyteorder(">")
        entries.append((name, data if data.dtype == logical else data.view(logical), zero_copy,
                        byte_swapped))
    return TensorFile(path, format_name, metadata, entries)


def _dtype_kind(name: str) -> str:
    """"float", "complex", "int" (signed or unsigned) or "bool", for a ferry dtype name; the
    storage-only float8 types are each a kind of their own (they convert to nothing else, so a
    float request leaves them as they are)."""
    if name.startswith("float8"):
        return name
    if name.startswith(("float", "bfloat")):
        return "float"
    if name.startswith("complex"):
        return "complex"
    return "bool" if name == "bool" else "int"


def _device_dtype_for(requested: str | None, stored: np.dtype | str,
                      apply_to_all: bool) -> str | None:
    """The device dtype a load asks for a tensor stored as `stored`: `requested` where it applies
    (to every tensor with `apply_to_all`, else to the tensors of its kind), else None."""
    if requested is None:
        return None
    stored_name = stored if isinstance(stored, str) else _dtype_name(stored.newbyteorder("="))
    if apply_to_all or _dtype_kind(stored_name) == _dtype_kind(requested):
        return requested
    return None


def load_file(
    path: str | os.PathLike,
    device: Device | str | None = None,
    *,
    device_dtype: Any = None,
    device_dtype_all: bool = False,
    sharding: Any = None,
    names: str | Iterable[str] | None = None,
    pattern: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> dict[str, np.ndarray] | dict[str, Array]:
    """Every tensor of a safetensors, .npy or .npz file, by name (see `open_file`), or the ones
    `names`, `pattern` and `exclude` choose.

    Choosing tensors: `names` is a tensor name or a list of exact names; `pattern` a glob or a
    list of globs (`fnmatch.fnmatchcase` rules: `*` any characters, dots included, `?` one
    character, `[abc]`, `[a-z]`, `[!abc]`; case-sensitive, matched against the whole name);
    `exclude` globs of tensors to leave out. A tensor is loaded when it is one of `names` or
    matches a `pattern` (every tensor when neither is given) and matches no `exclude`. Only the
    chosen tensors' bytes are read (a compressed .npz member not chosen is not even inflated); the
    dict holds them in file order. A name the file does not hold, or a pattern that matches none of
    its tensors, raises `NotFoundError` naming it; an `exclude` that matches nothing is fine, one
    that leaves nothing to load raises `InvalidArgumentError`. The same rules as
    `ferry put --only/--exclude`, in every mode below (numpy, device, sharding).

    Without `device` (and `device_dtype`): read-only numpy arrays, zero-copy views of the mapped
    file where the data is stored little-endian and uncompressed; each array keeps the mapping
    alive until it is gone. With `device`: ferry.Arrays. On a device whose memory is the host's
    (host:N), each tensor stored as it is kept (uncompressed, little-endian, 64 KiB or more) is
    read from the file straight into its device memory with pread, FERRY_LOAD_READ_THREADS reads
    at once, never mapped into the process: the load holds one copy of the bytes. The others, and
    every tensor on other devices, are put straight from the mapped file in batched
    `device_put`s of 256 MiB of the file each, whose mapped pages are given back once put (the
    load never holds the file and the arrays at once); the file is unmapped when the call
    returns. `device_dtype` applies to the tensors of its kind (a floating-point dtype to floating-point tensors, an
    integer one to integer tensors: `"bfloat16"` leaves integer ids and masks alone), like
    `ferry put --device-dtype`; `device_dtype_all=True` applies it to every tensor.

    `sharding` spreads each tensor over a mesh (which may span processes, see docs/distributed.md):
    a `Sharding` (for every tensor of its rank; the others are replicated over its mesh), a dict
    {name: Sharding}, or a rule: a callable (name, shape, dtype) -> Sharding, such as
    `shard_along(mesh, dim)`. Each process sends only its own devices' shards, straight from the
    mapped file, so it reads only the bytes they cover (and every replicated tensor). In a job of
    several processes every process must call it with the same file, shardings and device dtype;
    when they differ, every process raises `InvalidArgumentError` naming the ranks and the first
    tensor (or mesh, or dtype argument) that differs, both values cut around the difference, in
    lines of at most 80 columns; when it fails on one, it raises the same error on every process.
    """
    if sharding is not None:
        if device is not None:
            raise InvalidArgumentError(
                "load_file: give a device or a sharding, not both (the sharding's mesh names the "
                "devices)")
        return _load_file_sharded(path, sharding, device_dtype, device_dtype_all,
                                  dict(names=names, pattern=pattern, exclude=exclude))
    if device is None and device_dtype is None:
        return dict(open_file(path, names=names, pattern=pattern, exclude=exclude))
    # One C++ call (the same load as `ferry put`): no numpy view of the file, no per-tensor
    # Python, and no ml_dtypes for a file of bfloat16 weights.
    target = _resolve_device(device) or _ferry.device("host:0")
    requested = None if device_dtype is None else _dtype_name(device_dtype)
    return dict(_ferry._load_file_onto(
        os.fspath(path), _string_list(names, "names"), _string_list(pattern, "pattern"),
        _string_list(exclude, "exclude"), target, requested, bool(device_dtype_all)))


def _load_windows(names: list[str], arrays: Mapping[str, np.ndarray]) -> Iterator[list[str]]:
    """The names in file order, in runs of at most FERRY_LOAD_WINDOW_BYTES (one tensor at
    least; 0: one run)."""
    limit = _ferry._load_window_bytes() or 1 << 62
    window: list[str] = []
    size = 0
    for name in names:
        nbytes = arrays[name].nbytes
        if window and size + nbytes > limit:
            yield window
            window, size = [], 0
        window.append(name)
        size += nbytes
    if window:
        yield window


def _contiguous_ranges(views: Iterable[np.ndarray]) -> list[tuple[int, int]]:
    """(address, size) of the memory under `views`, neighbours merged (a window of a file's
    tensors: one range, however many small tensors it holds; safetensors pads them to 8 bytes)."""
    ranges: list[tuple[int, int]] = []
    for address, nbytes in sorted((v.__array_interface__["data"][0], v.nbytes) for v in views
                                  if v.nbytes):
        if ranges and address - (ranges[-1][0] + ranges[-1][1]) <= 64:
            begin, size = ranges[-1]
            ranges[-1] = (begin, max(size, address + nbytes - begin))
        else:
            ranges.append((address, nbytes))
    return ranges


def _release_file_pages(ranges: list[tuple[int, int]]) -> None:
    """Gives back the mapped file pages in `ranges` (_contiguous_ranges of read-only views of a
    mapped tensor file that a "copy" put has finished reading): they leave the process's memory,
    the page cache keeps them, and a later read of the views faults them in again with the same
    bytes. Memory that is not a mapped file's is left alone."""
    for address, size in ranges:
        _ferry._release_mapped_pages(address, size)


def _prefetched_windows(names: list[str], arrays: Mapping[str, np.ndarray]
                        ) -> Iterator[tuple[list[str], list[tuple[int, int]]]]:
    """_load_windows, each with the memory ranges of its views (for _release_file_pages), and
    each window's mapped pages faulted in ahead: the first before it is yielded, each next one on
    a thread of its own (FERRY_LOAD_READ_THREADS reads in flight, without the GIL) while the
    caller puts the current one; a cold file is read at the disk's rate, not one page fault at a
    time."""
    threads = _ferry._load_read_threads()
    windows = [(window, _contiguous_ranges(arrays[name] for name in window))
               for window in _load_windows(names, arrays)]

    def fault_in(ranges: list[tuple[int, int]]) -> None:
        for address, size in ranges:
            _ferry._prefetch_mapped_pages(address, size, threads)

    if windows:
        fault_in(windows[0][1])
    for index, window in enumerate(windows):
        ahead = None
        if index + 1 < len(windows):
            ahead = threading.Thread(target=fault_in, args=(windows[index + 1][1],), daemon=True,
                                     name="ferry-load-prefetch")
            ahead.start()
        yield window
        if ahead is not None:
            ahead.join()


def shard_along(mesh: Mesh, dim: int = 0, axes: str | Sequence[str] | None = None,
                min_bytes: int = 0) -> Callable[[str, tuple[int, ...], np.dtype], Sharding]:
    """A load_file sharding rule: dim `dim` of every tensor split over the mesh axes `axes` (all of
    them by default, major to minor); tensors of lower rank, or smaller than `min_bytes`,
    replicated over the mesh."""
    split = list(mesh.axis_names) if axes is None else ([axes] if isinstance(axes, str) else list(axes))

    def rule(name: str, shape: tuple[int, ...], dtype: np.dtype) -> Sharding:
        spec: list[Any] = [None] * len(shape)
        if dim < len(shape) and int(np.prod(shape)) * dtype.itemsize >= min_bytes:
            spec[dim] = tuple(split)
        return Sharding(mesh, spec)

    return rule


def _sharding_for(rule: Any, name: str, array: np.ndarray) -> Sharding:
    if isinstance(rule, Sharding):
        if len(rule.spec) == array.ndim:
            return rule
        return Sharding(rule.mesh, [None] * array.ndim)
    if isinstance(rule, Mapping):
        if name not in rule:
            raise InvalidArgumentError(f"load_file: the sharding dict has no entry for tensor '{name}'")
        return rule[name]
    if callable(rule):
        result = rule(name, tuple(array.shape), array.dtype)
        if not isinstance(result, Sharding):
            raise InvalidArgumentError(
                f"load_file: the sharding rule returned {type(result).__name__} for '{name}', not a Sharding")
        return result
    raise InvalidArgumentError(
        f"load_file: sharding must be a Sharding, a dict or a callable, not {type(rule).__name__}")


def _plan_text(text: str) -> str:
    """`text` as one line of a plan: escaped where it is not printable (a newline would split it)."""
    return text if text.isprintable() else repr(text)[1:-1]


def _describe_plan(shardings: dict[str, Sharding], arrays: dict[str, np.ndarray],
                   device_dtype: str | None, device_dtype_all: bool) -> str:
    """What every process must agree on, one field a line (`name: value`) so that a difference is
    reported by the field it is in (AgreeOnValue: "first in NAME:", both values cut around it):
    the dtype request, each tensor in file order (its dtype, shape, mesh and spec), then each
    mesh (global device ids, shape, axis names), numbered in order of first use."""
    lines = [f"device_dtype: {device_dtype or '-'}", f"device_dtype_all: {device_dtype_all}"]
    meshes: dict[tuple[Any, ...], int] = {}
    for name, sharding in shardings.items():
        mesh = sharding.mesh
        key = (tuple(d.id for d in mesh.devices), mesh.shape, mesh.axis_names)
        number = meshes.setdefault(key, len(meshes) + 1)
        array = arrays[name]
        spec = ", ".join("None" if axes is None else repr(axes) for axes in sharding.spec)
        lines.append(f"{_plan_text(name)}: {array.dtype} {list(array.shape)}, mesh {number}, "
                     f"spec [{spec}]")
    for (ids, shape, axis_names), number in meshes.items():
        axes = ", ".join(_plan_text(a) for a in axis_names)
        lines.append(f"mesh {number}: devices [{', '.join(map(str, ids))}], shape {list(shape)}, "
                     f"axes [{axes}]")
    return "\n".join(lines)


def _load_file_sharded(path: Any, rule: Any, device_dtype: Any, device_dtype_all: bool,
                       selection: dict[str, Any]) -> dict[str, Array]:
    requested = None if device_dtype is None else _dtype_name(device_dtype)
    arrays: dict[str, np.ndarray] = {}
    shardings: dict[str, Sharding] = {}
    # Step names are the same on every rank (the agreed error names the failing rank's file).
    with distributed.agreed("load_file: opening the file"):
        arrays = dict(open_file(path, **selection))
        shardings = {name: _sharding_for(rule, name, array) for name, array in arrays.items()}
    if process_count() > 1:
        _ferry._agree_on_value(_describe_plan(shardings, arrays, requested, device_dtype_all),
                               "load_file: the tensors and their shardings")
    placed: dict[str, Array] = {}
    with distributed.agreed("load_file: putting the shards"):
        for name, array in arrays.items():
            # Only this process's shards' bytes, not the kernel's read-around past their edges.
            _ferry._advise_shard_reads(*_prepare(array), shardings[name]._sharding)
            placed[name] = device_put(
                array, shardings[name],
                device_dtype=_device_dtype_for(requested, array.dtype, device_dtype_all))
        for each in placed.values():
            each.block_until_ready()
    return placed


def _file_format(path: str, format: str | None) -> str:
    if format is not None:
        if format not in ("safetensors", "npy", "npz"):
            raise InvalidArgumentError(
                f"format must be 'safetensors', 'npy' or 'npz', not {format!r}")
        return format
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _FILE_FORMATS:
        raise InvalidArgumentError(
            f"cannot tell the format of {path!r} from its extension: name it .safetensors, .npy or "
            ".npz, or pass format=")
    return _FILE_FORMATS[suffix]


def _prepare_for_file(x: Any) -> tuple[Any, str | None]:
    if isinstance(x, Array):
        x = x.to_numpy()
    elif isinstance(x, (list, tuple, int, float, complex, bool)):
        x = np.asarray(x)
    if isinstance(x, np.ndarray) and x.dtype.byteorder == ">":
        x = x.astype(x.dtype.newbyteorder("<"))  # files are written little-endian
    return _prepare(x)


def save_file(
    tensors: Mapping[str, Any] | Any,
    path: str | os.PathLike,
    *,
    format: str | None = None,
    metadata: Mapping[str, str] | None = None,
    compressed: bool = False,
) -> None:
    """Writes `tensors` (name -> numpy array, torch tensor or any buffer / DLPack object, read
    through its own strides) to `path` as safetensors, .npy or .npz.

    `format` defaults to the one the extension names (.safetensors, .npy, .npz). safetensors
    takes every dtype but complex128 and may carry `metadata` (str -> str, its `__metadata__`);
    .npy holds exactly one array (a dict with one entry, or the array itself) and no bfloat16 or
    float8; .npz is numpy.savez, or numpy.savez_compressed with `compressed=True`. The file is
    written to `path + ".partial"` and renamed when complete. The GIL is released while writing:
    do not change the arrays from another thread meanwhile.
    """
    path = os.fspath(path)
    format = _file_format(path, format)
    if isinstance(tensors, Mapping):
        items = list(tensors.items())
    elif format == "npy":
        items = [("array", tensors)]
    else:
        raise InvalidArgumentError(
            f"save_file takes a mapping of name to array for {format}, not {type(tensors).__name__}")
    names, objects, overrides = [], [], []
    for name, value in items:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"tensor names must be str, not {type(name).__name__}")
        obj, override = _prepare_for_file(value)
        names.append(name)
        objects.append(obj)
        overrides.append(override)
    metadata_dict = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentError("metadata maps str to str")
        metadata_dict[key] = value
    _ferry._save_file(path, format, names, objects, overrides, metadata_dict, bool(compressed))


def metrics() -> dict[str, float]:
    """Counters and gauges by name; value metrics as NAME.count and NAME.sum.

    The gauges ``HostMemoryCacheBytes`` and ``HostMemoryCacheLimitBytes`` say how much freed host
    memory ferry keeps for reuse, and the most it may keep (``FERRY_HOST_MEMORY_CACHE_BYTES``);
    ``DeviceMemoryCacheBytes`` and ``DeviceMemoryCacheLimitBytes`` the same for the freed device
    memory of the opencl devices, summed over them.
    """
    return _ferry.metrics()


def metrics_report() -> str:
    """Every metric as text: counters, and value metrics with their percentiles."""
    return _ferry.metrics_report()


def reset_metrics() -> None:
    """Sets every counter and value metric back to zero (gauges keep their levels)."""
    _ferry.reset_metrics()


def settings() -> dict[str, dict[str, str | None]]:
    """Every setting ferry reads from the environment, by variable name (docs/settings.md).

    Each entry has ``value`` (the text in effect, ``None`` when the default applies), ``source``
    (``"override"`` from :func:`set_setting`, ``"environment"`` or ``"default"``), ``default``,
    ``kind`` (what a value must be), ``scope`` (``"process"``, ``"client"``: read when a backend
    starts, or ``"plugin"``: read by ``ferry_pjrt_plugin.so`` from the environment),
    ``client_option`` and ``meaning``.
    """
    return {row["name"]: {k: v for k, v in row.items() if k != "name"} for row in _ferry.settings()}


def set_setting(name: str, value: str | int | float | None) -> None:
    """Overrides the environment variable ``name`` for this process; ``None`` removes the override.

    The value is checked at once: a bad one raises :class:`InvalidArgumentError` naming the
    variable, an unknown name :class:`NotFoundError`. An empty string makes the setting unset (its
    default applies) whatever the environment says. A client's settings apply to backends started
    afterwards; ``FERRY_HOST_MEMORY_CACHE_BYTES`` and ``FERRY_CONVERT_KERNELS`` apply at once. A
    setting that a backend reads when it starts, set (or removed) after that backend has started in
    this process (by the first ``devices()``, ``device_put``...), changes nothing here: a
    ``RuntimeWarning`` says so.
    """
    if value is None:
        _ferry.clear_setting(name)
    else:
        _ferry.set_setting(name, str(value))
    backend = _SETTINGS_READ_AT_BACKEND_START.get(name)
    if backend is not None and _ferry._backend_started(backend):
        warnings.warn(
            f"set_setting({name!r}): the {backend} backend has started already and read {name} "
            f"then; the new value changes nothing in this process (set it before the first call "
            f"that uses the {backend} backend, such as ferry.devices())",
            RuntimeWarning, stacklevel=2)


# The settings a backend reads once, when it starts in this process (scope "client" in
# docs/settings.md, and the plugin search path): set later, they change nothing (set_setting warns).
_SETTINGS_READ_AT_BACKEND_START = {
    "FERRY_HOST_DEVICES": "host",
    "FERRY_HOST_MEMORY_LIMIT": "host",
    "FERRY_OPENCL_LIBRARY": "opencl",
    "FERRY_PJRT_PLUGIN": "pjrt",
    "FERRY_PJRT_SEARCH_PATH": "pjrt",
}


ALIGNMENT = 64
"""Bytes to which host memory must be aligned for the host device to alias it (zero_copy)."""


def empty(shape: int | Sequence[int], dtype: Any = "float32") -> np.ndarray:
    """A new, uninitialised, writable numpy array whose data starts on an ALIGNMENT (64-byte)
    boundary: fill it, then `device_put(a, semantics="zero_copy")` lets the host device alias it
    rather than copy it (check `Array.is_alias`). numpy's own arrays are only 16-byte aligned, so
    a zero_copy put of one falls back to a copy whenever its address is not a multiple of 64."""
    shape_tuple = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    if any(n < 0 for n in shape_tuple):
        # As numpy: a negative size is an error, never an empty or a reshaped array.
        raise ValueError(f"negative dimensions are not allowed: shape {shape_tuple}")
    numpy_dtype = _NUMPY_DTYPES[_dtype_name(dtype)]
    nbytes = numpy_dtype.itemsize * math.prod(shape_tuple)
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset:offset + nbytes].view(numpy_dtype).reshape(shape_tuple)
