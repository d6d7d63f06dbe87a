"""Devices by name and by process: ferry.devices(), ferry.device(), the job's processes."""

from __future__ import annotations

from . import _ferry
from ._ferry import Device
from ._errors import InvalidArgumentError


def _resolve_device(device: Device | str | None) -> Device | None:
    if device is None or isinstance(device, Device):
        return device
    if isinstance(device, str):
        return _ferry.device(device)
    raise InvalidArgumentError(
        f"device must be a ferry.Device, a name, a ferry.Sharding (device_put) or None, not "
        f"{device!r}")


def _backend_name(backend: object, where: str) -> None:
    if not isinstance(backend, str):
        raise TypeError(f"{where} takes a backend name (\"host\", \"opencl\", \"pjrt\"), not "
                        f"{type(backend).__name__} {backend!r}")


def devices(backend: str | None = None) -> list[Device]:
    """This process's devices of `backend` ("host", "opencl", "pjrt"), or of every backend that can
    start here."""
    if backend is not None:
        _backend_name(backend, "devices()")
    return _ferry.devices(backend)


def global_devices(backend: str = "host") -> list[Device]:
    """Every process's devices of `backend`, in process order (the position is `Device.id`): this
    process's own, and the others' as descriptions (`is_addressable` False) that a Mesh may hold.
    Collective the first time for each backend: every process must call it (after
    `ferry.distributed.initialize()`). In one process: `devices(backend)`."""
    _backend_name(backend, "global_devices()")
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
    if not isinstance(name, str):
        raise TypeError(f"device() takes a device name such as \"host:0\", not "
                        f"{type(name).__name__} {name!r}")
    return _ferry.device(name)
