"""Metrics and settings (docs/settings.md)."""

from __future__ import annotations

import warnings

from . import _ferry


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
    if not isinstance(name, str):
        raise TypeError(f"set_setting takes the setting's name (a str such as "
                        f"'FERRY_HOST_DEVICES'), not {type(name).__name__} {name!r}")
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
