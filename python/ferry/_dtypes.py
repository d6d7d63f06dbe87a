"""ferry's dtypes as numpy (and ml_dtypes, torch, JAX) know them, and the device dtype a load
asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._errors import InvalidArgumentError


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

    def viewed_as_uint(self, dtype: np.dtype) -> tuple[str, np.dtype] | None:
        """(ferry's name, the unsigned carrier in the dtype's own byte order) for an ml_dtypes
        dtype, either byte order; None for any other."""
        if dtype.num < _NPY_USERDEF:
            return None
        found = self._ml_dtypes().get(dtype.newbyteorder("="))
        if found is None:
            return None
        name, carrier = found
        return name, np.dtype(carrier).newbyteorder(dtype.byteorder)

    def has(self, dtype: np.dtype) -> bool:
        """Whether ferry has this numpy dtype (in either byte order)."""
        dtype = dtype.newbyteorder("=")
        return dtype in self.builtin or self.viewed_as_uint(dtype) is not None

    def name_of(self, dtype: np.dtype) -> str | None:
        """ferry's name for `dtype` in either byte order (a name says what the values are, not
        how some memory lays them out: a device stores its own order); None if it has none."""
        dtype = dtype.newbyteorder("=")
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
