"""Meshes of devices and how a tensor is split over them (Mesh, Sharding, Shard), and the
sharding rules of a load."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from . import _ferry
from ._ferry import Device
from ._errors import InvalidArgumentError
from ._devices import _resolve_device


def _sizes(value: Any, what: str) -> list[int]:
    """A shape given to ferry: a sequence of ints (numpy ints too), never a str (its characters),
    a float (truncated), or a bool; TypeError naming `what` otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"{what} must be a sequence of ints, not {type(value).__name__} {value!r}")
    sizes = []
    for size in value:
        if isinstance(size, (bool, np.bool_)):
            raise TypeError(f"{what} must be a sequence of ints, not holding the bool {size!r}")
        try:
            sizes.append(operator.index(size))
        except TypeError:
            raise TypeError(f"{what} must be a sequence of ints, not holding "
                            f"{type(size).__name__} {size!r}") from None
    return sizes


class Mesh:
    """Devices in an n-d grid with named axes; `devices` are listed in row-major grid order.
    Meshes of the same devices, shape and axis names are equal (and hash alike), as JAX's are."""

    def __init__(self, devices: Sequence[Device | str], shape: Sequence[int], axis_names: Sequence[str]):
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
            raise TypeError(f"Mesh devices must be a sequence of ferry.Device or names, not "
                            f"{type(devices).__name__} {devices!r}")
        resolved = [_resolve_device(d) for d in devices]
        shape = _sizes(shape, "Mesh shape")
        needed = math.prod(shape)
        if 0 < len(resolved) < needed and all(d.name.startswith("host:") for d in resolved):
            raise InvalidArgumentError(
                f"mesh shape {[int(n) for n in shape]} needs {needed} devices, got "
                f"{len(resolved)}: {_ferry._device_count_hint('host')}")
        # One str is one axis, as JAX's Mesh takes it; any other iterable is read once.
        if not isinstance(axis_names, (str, Iterable)):
            raise TypeError(f"Mesh axis_names must be a sequence of str, not "
                            f"{type(axis_names).__name__} {axis_names!r}")
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if not all(isinstance(a, str) for a in axis_names):
            raise InvalidArgumentError(
                f"mesh axis names must be a sequence of str, got {axis_names!r} (a spec names "
                "axes by these strings)")
        self._mesh = _ferry._Mesh(resolved, shape, list(axis_names))

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

    def _key(self) -> tuple[Any, ...]:
        return (tuple(self.devices), self.shape, self.axis_names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

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
        self._mesh_object = mesh
        self._spec = tuple(spec)
        self._sharding = _ferry._Sharding(mesh._mesh, entries)

    @property
    def mesh(self) -> Mesh:
        """The mesh (read-only: a Sharding is made once, as the shards it plans)."""
        return self._mesh_object

    @property
    def spec(self) -> tuple[Any, ...]:
        """The spec as given (read-only)."""
        return self._spec

    def shard_indices(self, shape: Sequence[int]) -> list[tuple[slice, ...]]:
        """Each mesh device's index (a tuple of slices) into a tensor of `shape`, in mesh order."""
        return [
            tuple(slice(begin, end) for begin, end in ranges)
            for ranges in self._sharding.shard_indices(_sizes(shape, "shard_indices shape"))
        ]

    def _key(self) -> tuple[Any, ...]:
        normal = tuple(None if e is None else (e,) if isinstance(e, str) else tuple(e)
                       for e in self._spec)
        while normal and normal[-1] is None:  # padded with None, as a tensor's rank needs
            normal = normal[:-1]
        return (self._mesh_object, normal)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sharding) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"ferry.Sharding({self.mesh!r}, spec={self.spec!r})"


@dataclass(frozen=True, eq=False)
class Shard:
    """One mesh device's part of a sharded Array, read back to the host (an unsharded Array has
    one shard: all of it). `device_dtype` is what that device stores."""

    device: Device
    index: tuple[slice, ...]
    data: np.ndarray
    device_dtype: str | None = None


def shard_along(mesh: Mesh, dim: int = 0, axes: str | Sequence[str] | None = None,
                min_bytes: int = 0) -> Callable[[str, tuple[int, ...], np.dtype], Sharding]:
    """A load_file sharding rule: dim `dim` of every tensor split over the mesh axes `axes` (all of
    them by default, major to minor); tensors of lower rank, or smaller than `min_bytes`,
    replicated over the mesh. A negative `dim` counts from each tensor's last dim (-1: the last),
    and a tensor with fewer than -dim dims is replicated."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"shard_along needs a ferry.Mesh, not {type(mesh).__name__}")
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"shard_along dim must be an int, not {type(dim).__name__} {dim!r}")
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, (int, np.integer)):
        raise TypeError(f"shard_along min_bytes must be an int, not {type(min_bytes).__name__}")
    split = list(mesh.axis_names) if axes is None else ([axes] if isinstance(axes, str) else list(axes))

    def rule(name: str, shape: tuple[int, ...], dtype: np.dtype) -> Sharding:
        spec: list[Any] = [None] * len(shape)
        at = dim + len(shape) if dim < 0 else dim
        if 0 <= at < len(shape) and int(np.prod(shape)) * dtype.itemsize >= min_bytes:
            spec[at] = tuple(split)
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
        if not isinstance(rule[name], Sharding):
            raise InvalidArgumentError(
                f"load_file: the sharding dict's entry for '{name}' is {type(rule[name]).__name__}, "
                "not a Sharding")
        return rule[name]
    if callable(rule):
        result = rule(name, tuple(array.shape), array.dtype)
        if not isinstance(result, Sharding):
            raise InvalidArgumentError(
                f"load_file: the sharding rule returned {type(result).__name__} for '{name}', not a Sharding")
        return result
    raise InvalidArgumentError(
        f"load_file: sharding must be a Sharding, a dict or a callable, not {type(rule).__name__}")
