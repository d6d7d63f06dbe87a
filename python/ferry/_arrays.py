"""ferry.Array's Python side: the methods module.cc defines on the class call these (by name,
from the ferry package), and host memory that the host device can alias (empty)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import _ferry
from ._errors import Error, FailedPreconditionError
from ._dtypes import _dtype_name, _NUMPY_DTYPES
from ._sharding import Mesh, Shard, Sharding
from ._inputs import _DLPACK_CPU
from ._transfers import _start_read_into, device_get, device_put


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


def _array_scalar(self: Array, convert: Any, what: str) -> Any:
    """float(a), int(a), complex(a): the one element of a one-element array, converted as numpy
    converts its scalar; TypeError for any other size (numpy's and JAX's rule)."""
    if self.size != 1:
        raise TypeError(f"only an array of one element converts to a Python {what}; this one has "
                        f"{self.size}")
    return convert(self.to_numpy().reshape(())[()])


def _array_float(self: Array) -> float:
    return _array_scalar(self, float, "float")


def _array_int(self: Array) -> int:
    return _array_scalar(self, int, "int")


def _array_complex(self: Array) -> complex:
    return _array_scalar(self, complex, "complex")


def _array_index(self: Array) -> int:
    """operator.index(a) (a[...] indices, range(a)): a 0-d array of an integer dtype only, as
    numpy's rule (a float or a bool is no index)."""
    if self.ndim != 0 or self.dtype.kind not in "iu":
        raise TypeError("only a 0-d array of an integer dtype is an index; this one is "
                        f"{self.dtype} of shape {self.shape}")
    return int(self.to_numpy()[()])


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
    """Array.__reduce__: through the host (the data as numpy), then put back where it was. An
    array whose mesh holds other processes' devices is refused (as JAX refuses one that is not
    fully addressable): the devices' names would name this process's devices once unpickled."""
    if not array.is_fully_addressable:
        raise FailedPreconditionError(
            "cannot pickle a ferry.Array whose mesh holds other processes' devices; pickle "
            "a.to_numpy() (a replicated array) or a.local_shards() instead")
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


ALIGNMENT = 64
"""Bytes to which host memory must be aligned for the host device to alias it (zero_copy)."""


def empty(shape: int | Sequence[int], dtype: Any = "float32") -> np.ndarray:
    """A new, uninitialised, writable numpy array whose data starts on an ALIGNMENT (64-byte)
    boundary: fill it, then `device_put(a, semantics="zero_copy")` lets the host device alias it
    rather than copy it (check `Array.is_alias`). numpy's own arrays are only 16-byte aligned, so
    a zero_copy put of one falls back to a copy whenever its address is not a multiple of 64."""
    from ._sharding import _sizes

    shape_tuple = tuple(_sizes([shape] if isinstance(shape, (int, np.integer)) and
                               not isinstance(shape, bool) else shape, "empty shape"))
    if any(n < 0 for n in shape_tuple):
        # As numpy: a negative size is an error, never an empty or a reshaped array.
        raise ValueError(f"negative dimensions are not allowed: shape {shape_tuple}")
    numpy_dtype = _NUMPY_DTYPES[_dtype_name(dtype)]
    nbytes = numpy_dtype.itemsize * math.prod(shape_tuple)
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset:offset + nbytes].view(numpy_dtype).reshape(shape_tuple)
