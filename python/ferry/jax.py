"""JAX with ferry's host transfers, no code change: ferry's PJRT plugin (docs/jax.md).

``ferry_pjrt_plugin.so`` wraps a real PJRT plugin (the XLA CPU plugin here; a CUDA or TPU plugin
elsewhere): JAX gets the real plugin's table for compilation, execution and everything else, and
ferry's path for ``BufferFromHostBuffer`` (strided numpy views through ferry's copy kernels into
warm memory) and ``ToHostBuffer``::

    import ferry.jax
    ferry.jax.register()            # before JAX creates its backends
    import jax
    x = jax.device_put(np_array.T, jax.devices("ferry")[0])

Or, with ``FERRY_JAX_PLUGIN=1`` in the environment, ``import jax`` registers it by itself
(the ``jax_plugins`` entry point: :func:`initialize`).

:func:`load_file` puts a checkpoint straight into ``jax.Array``s, each shard converted to the
dtype asked for in the one pass that reads it from the mapped file.
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import InvalidArgumentError, UnavailableError

__all__ = ["counters", "initialize", "load_file", "plugin_path", "register"]

PLATFORM = "ferry"


def plugin_path() -> str:
    """The path of ``ferry_pjrt_plugin.so``: ``FERRY_PJRT_PLUGIN_LIBRARY`` if set, else the copy
    installed next to this package. Raises ferry.UnavailableError when there is none (ferry was
    built with FERRY_PJRT=OFF)."""
    path = os.environ.get("FERRY_PJRT_PLUGIN_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "ferry_pjrt_plugin.so"
    )
    if not os.path.isfile(path):
        raise UnavailableError(
            f"ferry's PJRT plugin is not at {path}: this ferry was built with FERRY_PJRT=OFF "
            "(reinstall it without that option), or set FERRY_PJRT_PLUGIN_LIBRARY"
        )
    return path


def register(
    wrapped: str | None = None,
    *,
    platform: str = PLATFORM,
    priority: int = 400,
    options: dict | None = None,
) -> None:
    """Registers ferry's plugin with JAX as platform ``platform`` (``jax.devices("ferry")``).

    wrapped: the plugin ferry wraps, a path or an installed package name ("xla_cpu_pjrt"); by
      default ``FERRY_PJRT_WRAPPED_PLUGIN``, else the plugin ferry's ``pjrt`` backend would pick
      (``FERRY_PJRT_PLUGIN``, then the first one installed). It is read when JAX first loads the
      plugin, once per process.
    priority: JAX's backend priority; at JAX's default (400) the platform becomes JAX's default
      backend, above "cpu" (0). Lower it to keep another default.
    options: the client create options JAX passes to the wrapped plugin (e.g.
      ``{"cpu_device_count": 4}``).

    Call it before JAX creates its backends (the first ``jax.devices()``, array or jit). A second
    call for the same platform does nothing.
    """
    path = plugin_path()
    if wrapped:
        os.environ["FERRY_PJRT_WRAPPED_PLUGIN"] = wrapped
    from jax._src import xla_bridge  # JAX's plugin registry (what jax_plugins packages call)

    if platform in xla_bridge._backend_factories:
        return  # already registered (by the jax_plugins entry point, or an earlier call)
    xla_bridge.register_plugin(platform, priority=priority, library_path=path, options=options)


_COUNTER_NAMES = ("puts_by_ferry", "puts_by_plugin", "reads_by_ferry", "reads_by_plugin", "refused",
                  "puts_after_the_call", "bytes_in_use")


def counters() -> dict[str, int]:
    """Which path the plugin's transfer entries took in this process so far: ``puts_by_ferry``
    (written by ferry's kernels into warm memory), ``puts_by_plugin`` (passed to the wrapped
    plugin: dense aligned zero-copy sources it aliases, and what ferry does not take),
    ``reads_by_ferry``, ``reads_by_plugin``, ``refused`` (bad input answered with an error), and
    ``puts_after_the_call`` (of ``puts_by_ferry``, those whose call returned before ferry had
    written the buffer: the buffer becomes ready when it has); and ``bytes_in_use``, the memory
    ferry's plugin holds for its buffers now."""
    library = ctypes.CDLL(plugin_path())  # the copy JAX loaded: same file, same handle
    read = library.FerryPjrtPluginCounters
    read.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    read.restype = ctypes.c_int
    values = (ctypes.c_int64 * len(_COUNTER_NAMES))()
    read(values, len(_COUNTER_NAMES))
    return dict(zip(_COUNTER_NAMES, values))


def initialize() -> None:
    """The ``jax_plugins`` entry point: registers the plugin when ``FERRY_JAX_PLUGIN=1``.

    Opt-in, because a registered plugin becomes JAX's default backend in every JAX process of
    the environment."""
    if os.environ.get("FERRY_JAX_PLUGIN") == "1":
        register()


def _default_jax_device() -> Any:
    """The first device of ferry's platform when it is registered with JAX, else JAX's default
    device."""
    import jax
    from jax._src import xla_bridge

    if PLATFORM in xla_bridge._backend_factories:
        return jax.devices(PLATFORM)[0]
    return jax.devices()[0]


def _jax_sharding_for(rule: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """The jax Sharding of tensor `name`: `rule` is one Sharding, a dict {name: Sharding} or a
    callable (name, shape, dtype) -> Sharding."""
    import jax

    if isinstance(rule, jax.sharding.Sharding):
        sharding = rule
    elif isinstance(rule, Mapping):
        if name not in rule:
            raise InvalidArgumentError(
                f"ferry.jax.load_file: the sharding dict has no entry for tensor {name!r}")
        sharding = rule[name]
    elif callable(rule):
        sharding = rule(name, shape, dtype)
    else:
        raise InvalidArgumentError(
            "ferry.jax.load_file: sharding must be a jax.sharding.Sharding, a dict or a callable, "
            f"not {type(rule).__name__}")
    if not isinstance(sharding, jax.sharding.Sharding):
        raise InvalidArgumentError(
            f"ferry.jax.load_file: the sharding for {name!r} is {type(sharding).__name__}, not a "
            "jax.sharding.Sharding")
    # A NamedSharding whose spec names more dimensions than this tensor has (a rule meant for the
    # matrices, met by a bias): replicated over the same mesh, as ferry.load_file does.
    spec = getattr(sharding, "spec", None)
    if spec is not None and len(spec) > len(shape):
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(),
                                              memory_kind=sharding.memory_kind)
    return sharding


def _open_files(paths: list[Any], names: Any, pattern: Any, exclude: Any
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every chosen tensor of the files, by name, as read-only views of their mappings (which the
    views keep alive), and the path of the file that holds each. One file: ferry's own selection
    (only the chosen tensors are read). Several: a name or pattern need only be in one of them, so
    each file is opened whole (mapped: nothing is read but a compressed .npz member) and the same
    rules are applied across all."""
    from . import NotFoundError, open_file
    from ._files import _string_list

    if len(paths) == 1:
        chosen = dict(open_file(paths[0], names=names, pattern=pattern, exclude=exclude))
        return chosen, dict.fromkeys(chosen, os.fsdecode(paths[0]))
    tensors: dict[str, np.ndarray] = {}
    files: dict[str, str] = {}
    for each in paths:
        for name, view in open_file(each).items():
            if name in tensors:
                raise InvalidArgumentError(
                    f"ferry.jax.load_file: tensor {name!r} is in more than one of the files")
            tensors[name] = view
            files[name] = os.fsdecode(each)
    wanted = _string_list(names, "names")
    patterns = _string_list(pattern, "pattern")
    excluded = _string_list(exclude, "exclude")
    for name in wanted:
        if name not in tensors:
            raise NotFoundError(f"ferry.jax.load_file: no tensor named {name!r} in the {len(paths)} files")
    for glob in patterns:
        if not any(fnmatch.fnmatchcase(name, glob) for name in tensors):
            raise NotFoundError(
                f"ferry.jax.load_file: pattern {glob!r} matches no tensor of the {len(paths)} files")
    chosen = {
        name: view for name, view in tensors.items()
        if ((not wanted and not patterns) or name in wanted
            or any(fnmatch.fnmatchcase(name, glob) for glob in patterns))
        and not any(fnmatch.fnmatchcase(name, glob) for glob in excluded)}
    if not chosen:
        raise InvalidArgumentError("ferry.jax.load_file: the exclude patterns leave no tensor to load")
    return chosen, files


def load_file(
    path: str | bytes | os.PathLike | Sequence[str | bytes | os.PathLike],
    sharding: Any = None,
    dtype: Any = None,
    *,
    device: Any = None,
    dtype_all: bool = False,
    names: str | Iterable[str] | None = None,
    pattern: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
) -> dict[str, Any]:
    """Every tensor of a safetensors, .npy or .npz file (or of each file of a list) as
    ``jax.Array``s, by name, in file order.

    Each shard is read by ferry from a strided view of the mapped file (only the bytes that shard
    covers), converted to ``dtype`` in that same pass on ferry's workers, into 64-byte-aligned
    memory of ferry's, which JAX then takes without another copy where the device's memory is host
    memory (ferry's platform over the CPU plugin, or JAX's "cpu"); a device whose memory is not
    host memory gets that buffer through its plugin's own transfer. The file is read once, and no
    cast runs on the device (but for a real tensor asked to be complex with ``dtype_all``: ferry
    never stores real as complex, so JAX casts that one once placed). A sharding's memory kind
    (``pinned_host``, ...) is where the shards go. The files are put 256 MiB at a time, each stretch's pages given back
    once put, so the load does not hold the files and the arrays at once.

    sharding: a ``jax.sharding.Sharding`` (a ``NamedSharding`` whose spec is longer than a
      tensor's rank replicates that tensor over its mesh), a dict {name: Sharding}, or a callable
      (name, shape, numpy dtype) -> Sharding. None: every tensor on ``device``.
    dtype: the dtype to store (a name, numpy, ml_dtypes or jnp dtype), applied as
      ``ferry.load_file``'s ``device_dtype`` is: to the tensors of its kind (a floating-point dtype
      to floating-point tensors, an integer one to integer tensors), or to all with
      ``dtype_all=True``. Types JAX does not keep without x64 (int64, float64, ...) are stored as
      JAX would canonicalise them (int32, float32, ...), in the same pass.
    device: a jax Device when there is no sharding; by default the first device of ferry's
      platform when ``register()`` was called, else JAX's default device.
    names, pattern, exclude: which tensors to load, as ``ferry.load_file`` takes them; with
      several files a name or pattern need be in only one of them.
    """
    import jax

    from ._dtypes import _dtype_name
    from ._files import _prefetched_windows, _release_file_pages
    from ._transfers import _device_put

    paths = [path] if isinstance(path, (str, bytes, os.PathLike)) else list(path)
    if not paths:
        raise InvalidArgumentError("ferry.jax.load_file: no file given")
    if sharding is not None and device is not None:
        raise InvalidArgumentError(
            "ferry.jax.load_file: give a device or a sharding, not both (the sharding names the "
            "devices)")
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(device or _default_jax_device())
    requested = None if dtype is None else _dtype_name(dtype)

    tensors, files = _open_files(paths, names, pattern, exclude)

    # Window by window (256 MiB of the files in file order): one batched ferry put of every shard
    # of the window's tensors into host:0, each converted on the way; the window's file pages are
    # then given back, so the load never holds the files and the converted copy at once.
    result: dict[str, Any] = {}
    for window, ranges in _prefetched_windows(list(tensors), tensors):
        plans = []  # (name, global shape, jax sharding, [device, ...], dtype to cast to or None)
        views: list[np.ndarray] = []
        view_dtypes: list[str] = []
        view_names: list[str] = []  # in errors: "<file>:<tensor>", as ferry.load_file names them
        for name in window:
            view = tensors[name]
            stored, cast_to = _stored_dtype(requested, view.dtype, dtype_all)
            tensor_sharding = _jax_sharding_for(sharding, name, tuple(view.shape), view.dtype)
            devices = []
            shards = tensor_sharding.addressable_devices_indices_map(tuple(view.shape))
            for shard, (device_of_shard, index) in enumerate(shards.items()):
                devices.append(device_of_shard)
                views.append(view[index] if index else view)  # () for a 0-d tensor
                view_dtypes.append(stored)
                view_names.append(f"{files[name]}:{name}" if len(shards) == 1
                                  else f"{files[name]}:{name}[shard {shard}]")
            plans.append((name, tuple(view.shape), tensor_sharding, devices, cast_to))
        host_arrays = _device_put(views, "host:0", view_dtypes, "copy", None, view_names)
        _release_file_pages(ranges)
        result.update(_handed_to_jax(host_arrays, view_dtypes, plans))
    return result


def _stored_dtype(requested: str | None, dtype: np.dtype, dtype_all: bool
                  ) -> tuple[str, str | None]:
    """(the dtype ferry stores a tensor of numpy `dtype` as, the dtype JAX then casts it to or
    None), for load_file's `dtype` request: JAX's canonical types (int64 -> int32 without x64).
    ferry never stores a real tensor as complex (it could not read it back in its own dtype,
    docs/conversions.md): such a one is put as it is, and JAX casts it once placed."""
    import jax

    from ._dtypes import _NUMPY_DTYPES, _device_dtype_for, _dtype_name

    native = _dtype_name(dtype.newbyteorder("="))
    stored = _device_dtype_for(requested, dtype, dtype_all) or native
    stored = _dtype_name(jax.dtypes.canonicalize_dtype(_NUMPY_DTYPES[stored]))
    if stored.startswith("complex") and dtype.kind not in "bc":
        return _dtype_name(jax.dtypes.canonicalize_dtype(_NUMPY_DTYPES[native])), stored
    return stored, None


def _handed_to_jax(host_arrays: list[Any], view_dtypes: list[str], plans: list[Any]
                   ) -> dict[str, Any]:
    """load_file's jax.Arrays of one window, by name: each shard's memory (ferry's host arrays,
    in the order of `plans`' devices) as a numpy array of its stored dtype, handed to JAX (aliased
    where the device's memory is host memory and the address 64-byte aligned, as ferry's is), into
    the memory the sharding names (its memory kind: pinned_host, ...)."""
    import jax

    from ._dtypes import _NUMPY_DTYPES

    shard_arrays = []
    for host_array, stored in zip(host_arrays, view_dtypes):
        stored_view, reason = host_array._numpy_view(stored=True)
        if stored_view is None:
            raise InvalidArgumentError(f"ferry.jax.load_file: cannot view a shard: {reason}")
        shard_arrays.append(stored_view.view(_NUMPY_DTYPES[stored]))
    shard_places = [
        jax.sharding.SingleDeviceSharding(device, memory_kind=tensor_sharding.memory_kind)
        for _, _, tensor_sharding, devices, _ in plans for device in devices]
    placed = jax.device_put(shard_arrays, shard_places)
    arrays: dict[str, Any] = {}
    position = 0
    for name, shape, tensor_sharding, devices, cast_to in plans:
        count = len(devices)
        arrays[name] = jax.make_array_from_single_device_arrays(
            shape, tensor_sharding, placed[position:position + count])
        if cast_to is not None:  # a computation: its result is put back where the sharding says
            arrays[name] = jax.device_put(arrays[name].astype(_NUMPY_DTYPES[cast_to]),
                                          tensor_sharding)
        position += count
    return arrays
