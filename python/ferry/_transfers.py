"""Puts and gets: device_put (one array, a pytree, a Sharding), the sharded constructors,
device_get and reads into the caller's arrays, from_dlpack."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Callable, Sequence

import numpy as np

from . import _ferry
from ._ferry import Array, Device, HostRead
from ._errors import Error, FailedPreconditionError, InvalidArgumentError
from ._dtypes import _dtype_name, _NUMPY_DTYPES
from ._devices import _resolve_device
from ._sharding import Sharding, _sizes
from ._inputs import _flatten, _leaf_device_dtypes, _prepare


_SEMANTICS = ("copy", "async", "zero_copy")


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
    # The same for a list of such arrays: one batched put, without the pytree's per-leaf work.
    if (type(x) is list and x and device_dtype is None and memory_kind is None
            and (device is None or type(device) is Device) and semantics in _SEMANTICS
            and all(type(leaf) is np.ndarray and leaf.dtype in _NUMPY_DTYPES.builtin
                    for leaf in x)):
        count = len(x)
        return _ferry.put_each(x, [None] * count, device, [None] * count, semantics, None,
                               [f"item {index}" for index in range(count)])
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
        try:
            array = _ferry.put_sharded(objects[0], overrides[0], target._sharding, names[0],
                                       semantics, memory_kind)
        except Error as error:
            if tensor_names is None:
                raise
            raise _renamed(error, tensor_names[0]) from None
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


def _renamed(error: Error, name: str) -> Error:
    """`error` of a sharded put naming its tensor `name`: the sharded put calls its input 'array'
    ("tensor 'array[shard 0]': ..."), which says nothing of a file's tensor."""
    message, count = re.subn(r"tensor 'array(?=['\[])", lambda _: f"tensor '{name}", str(error),
                             count=1)
    if not count:
        message = f"tensor '{name}': {message}"
    return type(error)(message).with_traceback(error.__traceback__)


def _copies_device_to_device(item: Any, target: Any, device_dtype: str | None,
                             memory_kind: str | None, where: str) -> bool:
    """Whether device_put copies `item` device to device: an unsharded ferry.Array put on one
    device, in its default memory, storing the same dtype, which the target holds."""
    if not isinstance(item, Array):
        return False
    if item.is_deleted():
        raise FailedPreconditionError(f"{where}: a ferry.Array that has been deleted")
    if isinstance(target, Sharding) or item._is_sharded or memory_kind is not None:
        return False
    if device_dtype is not None and device_dtype != item.device_dtype:
        return False
    target = target if target is not None else _ferry.device("host:0")
    return item.device_dtype in target.dtypes


def _with_sharding(array: Array, sharding: Sharding) -> Array:
    array._python_sharding = sharding
    return array


def _check_sharding(sharding: Any, where: str) -> None:
    if not isinstance(sharding, Sharding):
        raise TypeError(f"{where} needs a ferry.Sharding, not {type(sharding).__name__}")


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
    _check_sharding(sharding, "make_array_from_shards")
    shape = _sizes(shape, "make_array_from_shards shape")
    if dtype is not None:
        dtype = _dtype_name(dtype)
    if semantics not in _SEMANTICS:
        raise InvalidArgumentError(f"semantics must be one of {_SEMANTICS}, got {semantics!r}")
    if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Iterable):
        raise TypeError(f"make_array_from_shards arrays must be a sequence of one host array per "
                        f"mesh device, not {type(arrays).__name__}")
    prepared = [(None, None) if a is None else _prepare(a) for a in arrays]
    name = None if device_dtype is None else _dtype_name(device_dtype)
    array = _ferry.make_from_shards(
        shape, sharding._sharding, [p[0] for p in prepared],
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
    _check_sharding(sharding, "make_array_from_callback")
    if not callable(callback):
        raise TypeError(f"make_array_from_callback needs a callable, not {type(callback).__name__}")
    shards = [
        callback(index) if device.is_addressable else None
        for device, index in zip(sharding.mesh.devices,
                                 sharding.shard_indices(_sizes(shape, "make_array_from_callback shape")))
    ]
    return make_array_from_shards(shape, sharding, shards, device_dtype=device_dtype,
                                  semantics=semantics, dtype=dtype)


def _local_extents(sharding: Sharding, shape: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Per dim, the sorted distinct (begin, end) ranges that this process's devices hold."""
    indices = sharding.shard_indices(shape)
    local = [index for device, index in zip(sharding.mesh.devices, indices) if device.is_addressable]
    return [sorted({(index[d].start, index[d].stop) for index in local}) for d in range(len(shape))]


def _infer_global_shape(sharding: Sharding, local: np.ndarray) -> list[int]:
    """The global shape this process's `local` part implies: along each dim, the local size over
    the number of distinct shard ranges here, times their number globally."""
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
    return global_shape


def make_array_from_process_local_data(
    sharding: Sharding,
    local_data: Any,
    global_shape: Sequence[int] | None = None,
) -> Array:
    """A global Array from each process's own part (JAX's meaning): `local_data` holds, along each
    dim, the data of the distinct shard ranges this process's devices hold, in order (a dim that
    is not split, or split only within this process, is whole). Every process calls it with its
    own part. `global_shape` defaults to the local shape scaled by how many distinct ranges each
    dim has globally versus here (it must divide evenly; pass it for uneven shapes), which the
    processes compare (InvalidArgumentError on every process when they differ); when every mesh
    device is this process's, to the local shape."""
    _check_sharding(sharding, "make_array_from_process_local_data")
    if global_shape is not None:
        global_shape = _sizes(global_shape, "make_array_from_process_local_data global_shape")
    local = np.asarray(local_data)
    inferred = global_shape is None
    if inferred and all(d.is_addressable for d in sharding.mesh.devices):
        global_shape = local.shape  # every shard is this process's: the local data is all of it
    elif inferred:
        # Each process infers from its own part, and they compare (every process calls this): an
        # error on one process (parts that do not split evenly) is raised on every process, and
        # uneven parts, which would give each a different shape and shards labelled with the
        # wrong rows, are an error everywhere too.
        from .distributed import agreed

        with agreed("make_array_from_process_local_data: inferring the global shape"):
            global_shape = _infer_global_shape(sharding, local)
        _ferry._agree_on_value(
            f"global shape: {tuple(int(n) for n in global_shape)}",
            "make_array_from_process_local_data: the global shape inferred from each process's "
            "local data (pass global_shape for parts of uneven size)")
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
        read = _start_read_into(x, out, "device_get")
        try:
            return read.wait()
        except BaseException:
            # Interrupted (Ctrl-C, or an exception from a signal handler): the read would go on
            # writing into `out` after this call raised, with nothing left to wait on. It is let
            # finish first (a copy, bounded by the memory's speed; a second Ctrl-C does not cut
            # it short), so that `out` is the caller's again once the call is over.
            while not read.is_ready():
                try:
                    read.wait()
                except BaseException:  # noqa: BLE001, S110 - the first exception is raised
                    pass
            raise
    # The dtypes first: another thread may delete an array while its read runs (the read holds
    # its own handles and completes).
    logicals = [_NUMPY_DTYPES[array._dtype_name] for array in arrays]
    raw = _ferry.get(arrays)
    results = [data if data.dtype == logical else data.view(logical)
               for logical, data in zip(logicals, raw)]
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
            raise FailedPreconditionError("from_dlpack: a ferry.Array that has been deleted")
        target = _resolve_device(device)
        if target is None or (not obj._is_sharded and target == obj.device):
            alias = obj._alias()
            return _with_sharding(alias, obj.sharding) if obj._is_sharded else alias
        return device_put(obj, target)
    return device_put(obj, device, semantics="zero_copy")
