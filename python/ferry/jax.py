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
"""

from __future__ import annotations

import ctypes
import os

from . import UnavailableError

__all__ = ["counters", "initialize", "plugin_path", "register"]

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


_COUNTER_NAMES = ("puts_by_ferry", "puts_by_plugin", "reads_by_ferry", "reads_by_plugin", "refused")


def counters() -> dict[str, int]:
    """Which path the plugin's transfer entries took in this process so far: ``puts_by_ferry``
    (written by ferry's kernels into warm memory), ``puts_by_plugin`` (passed to the wrapped
    plugin: dense aligned zero-copy sources it aliases, and what ferry does not take),
    ``reads_by_ferry``, ``reads_by_plugin``, and ``refused`` (bad input answered with an error)."""
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
