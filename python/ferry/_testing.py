"""Switches for tests only: each GIL defence can be turned off to prove the other suffices."""

from . import _ferry


def set_release_gil(enabled: bool) -> None:
    """Defence 1: release the GIL in every call that can wait (default on)."""
    _ferry._set_release_gil(bool(enabled))


def set_deferred_release(enabled: bool) -> None:
    """Defence 2: never drop a Python object off the GIL; queue it instead (default on)."""
    _ferry._set_deferred_release(bool(enabled))


def pending_release_count() -> int:
    """Python objects queued for release under the GIL."""
    return _ferry._pending_release_count()


def drain_release_queue() -> None:
    _ferry._drain_release_queue()
