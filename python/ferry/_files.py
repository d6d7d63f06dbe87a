"""Tensor files (docs/files.md): open_file, load_file (onto a device, or sharded over a mesh),
save_file."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from . import _ferry, distributed
from ._ferry import Array, Device
from ._errors import InvalidArgumentError
from ._dtypes import _device_dtype_for, _dtype_name, _NUMPY_DTYPES
from ._devices import _resolve_device, process_count
from ._sharding import _sharding_for, Sharding
from ._inputs import _prepare
from ._transfers import _device_put


_FILE_FORMATS = {".safetensors": "safetensors", ".npy": "npy", ".npz": "npz"}


class TensorFile(Mapping):
    """A safetensors, .npy or .npz file opened by `open_file`: a read-only mapping from tensor
    name to numpy array, in the file's order (safetensors: by data offset; .npz: archive order).

    Arrays are read-only. Where `zero_copy(name)` is True the array is a view of the mapped file
    (no copy was made), big-endian data included (viewed with a big-endian dtype); otherwise
    (deflated .npz members) it views a copy decoded once at open time. Every array holds what it views: the arrays stay valid after this
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

    # Compared and hashed as an object (Mapping's __eq__ would compare arrays, which numpy cannot
    # answer with one bool).
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    @property
    def metadata(self) -> dict[str, str]:
        """safetensors' `__metadata__` (empty for numpy files)."""
        return dict(self._metadata)

    def zero_copy(self, name: str) -> bool:
        """Whether tensor `name` is a view of the mapped file rather than of a decoded copy."""
        return self._zero_copy[name]

    def byte_swapped(self, name: str) -> bool:
        """Whether the file stored tensor `name` big-endian (the array views those bytes as they
        are, with a big-endian dtype: its values are the file's)."""
        return self._byte_swapped[name]

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        return f"ferry.TensorFile({self._path!r}, format={self._format}, tensors={len(self)})"


def _utf8_text(text: str, what: str) -> str:
    """`text`, which a file holds as UTF-8 (a tensor name, metadata, a name to look for). A str
    with no UTF-8 form (a lone surrogate, as os.fsdecode makes of undecodable bytes) raises
    InvalidArgumentError naming it, before the extension's type check refuses it less clearly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgumentError(
            f"{what} {text!r} is not valid UTF-8 text (a lone surrogate at index {error.start}): "
            "tensor files hold names and metadata as UTF-8") from None
    return text


def _string_list(value: str | Iterable[str] | None, argument: str) -> list[str]:
    """names=, pattern=, exclude=: one string, or any iterable of strings (a bare string is one
    name, never its characters)."""
    if value is None:
        return []
    values = [value] if isinstance(value, (str, bytes)) else list(value)
    for each in values:
        if isinstance(each, bytes):  # one name, as a str is, but not text: say so
            raise TypeError(f"{argument}= takes strings, not bytes ({each!r}): decode it "
                            "(.decode()), tensor names are text")
        if not isinstance(each, str):
            raise TypeError(f"{argument}= takes strings, not {type(each).__name__}")
    return values


def _selectors(names: Any, pattern: Any, exclude: Any) -> tuple[list[bytes], ...]:
    """names=, pattern= and exclude= as the binding takes them (_string_list each, as bytes: UTF-8
    with surrogateescape, as os.fsencode, so that a name load_file gave back for a .npy file named
    by bytes that are not UTF-8 selects it)."""
    return tuple([value.encode("utf-8", "surrogateescape") for value in _string_list(given, name)]
                 for given, name in ((names, "names"), (pattern, "pattern"), (exclude, "exclude")))


def open_file(path: str | bytes | os.PathLike, *, names: str | Iterable[str] | None = None,
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
    path = os.fsdecode(path)  # a str, undecodable bytes kept as surrogates (os.listdir's names)
    format_name, metadata, raw = _ferry._load_file(
        os.fsencode(path), *_selectors(names, pattern, exclude))
    entries = []
    for name, data, dtype_name, zero_copy, byte_swapped in raw:
        logical = _NUMPY_DTYPES[dtype_name]
        if byte_swapped:  # big-endian data, viewed as it lies in the file (still zero-copy)
            logical = logical.newbyteorder(">")
        entries.append((name, data if data.dtype == logical else data.view(logical), zero_copy,
                        byte_swapped))
    return TensorFile(path, format_name, metadata, entries)


def load_file(
    path: str | bytes | os.PathLike,
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
    when what they plan differs (a tensor's name, dtype, shape or sharding, a mesh, the dtype
    arguments), every process raises `InvalidArgumentError` naming the ranks and the first
    tensor (or mesh, or dtype argument) that differs, both values cut around the difference, in
    lines of at most 80 columns; when it fails on one, it raises the same error on every process.
    The files' bytes are not compared: two files of the same tensors with other values (each
    process's own copy, out of date on one machine) load without an error.
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
        os.fsencode(path), *_selectors(names, pattern, exclude), target, requested,
        bool(device_dtype_all)))


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

    def fault_in(ranges: list[tuple[int, int]], views: Mapping[str, np.ndarray]) -> None:
        # `views` keeps the mapping of `ranges` alive while its pages are read.
        for address, size in ranges:
            _ferry._prefetch_mapped_pages(address, size, threads)

    if windows:
        fault_in(windows[0][1], arrays)
    ahead = None
    try:
        for index, window in enumerate(windows):
            if index + 1 < len(windows):
                ahead = threading.Thread(target=fault_in, args=(windows[index + 1][1], arrays),
                                         daemon=True, name="ferry-load-prefetch")
                ahead.start()
            yield window
            if ahead is not None:
                ahead.join()
                ahead = None
    finally:
        # The caller's loop body raised (a sharding rule, Ctrl-C in a put): the look-ahead ends
        # before the views of the file can go (before, it read pages of an unmapped file).
        if ahead is not None:
            ahead.join()


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
                               "load_file: the list of tensors and their shardings")
    placed: dict[str, Array] = {}
    file = os.fsdecode(path)  # errors name a tensor "<file>:<name>", as the unsharded load does
    with distributed.agreed("load_file: putting the shards"):
        for name, array in arrays.items():
            # Only this process's shards' bytes, not the kernel's read-around past their edges.
            _ferry._advise_shard_reads(*_prepare(array), shardings[name]._sharding)
            placed[name] = _device_put(
                array, shardings[name], _device_dtype_for(requested, array.dtype, device_dtype_all),
                "copy", None, tensor_names=[f"{file}:{name}"])
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
    path: str | bytes | os.PathLike,
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
    path = os.fsdecode(path)
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
        _utf8_text(name, "tensor name")
        obj, override = _prepare_for_file(value)
        names.append(name)
        objects.append(obj)
        overrides.append(override)
    metadata_dict = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgumentError("metadata maps str to str")
        metadata_dict[_utf8_text(key, "metadata key")] = _utf8_text(value, "metadata value")
    _ferry._save_file(os.fsencode(path), format, names, objects, overrides, metadata_dict,
                      bool(compressed))
