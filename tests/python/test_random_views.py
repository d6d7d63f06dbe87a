"""Random shapes, strides and dtype pairs against numpy's own indexing and astype."""

import ml_dtypes
import numpy as np
from hypothesis import given, settings, strategies as st

import ferry

DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, ml_dtypes.bfloat16,
]
DEVICE_DTYPES = [None, "float32", "bfloat16", "float16", "int32", "float64", "complex64"]


@st.composite
def strided_arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(st.lists(st.integers(0, 7), min_size=0, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base = (rng.standard_normal(shape) * 50).astype(dtype) if dtype.kind != "c" else (
        rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    # Random steps, reversals and a transpose: numpy's own view machinery makes the strides.
    index = tuple(
        slice(None, None, draw(st.sampled_from([1, 2, -1, -2]))) for _ in range(len(shape)))
    view = base[index]
    if view.ndim > 1 and draw(st.booleans()):
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    if view.ndim >= 1 and draw(st.booleans()):  # a broadcast (zero-stride) dim in front
        view = np.broadcast_to(view, (3,) + view.shape)
    return view


@settings(max_examples=150, deadline=None)
@given(strided_arrays(), st.sampled_from(DEVICE_DTYPES))
def test_strided_put_matches_numpy_astype(x, device_dtype):
    if device_dtype is not None and (x.dtype.kind == "c") != device_dtype.startswith("complex"):
        return  # complex <-> real storage is refused (tested in test_api)
    a = ferry.device_put(x, device_dtype=device_dtype)
    stored = ferry.device_get(a)
    assert stored.dtype == x.dtype and stored.shape == x.shape
    if device_dtype is None:
        np.testing.assert_array_equal(stored, x)
        return
    # numpy's astype is the reference for each leg of the round trip, except float -> int, where
    # numpy is undefined on overflow and NaN: there the reference is ferry's documented rule
    # (truncate toward zero, saturate, NaN -> 0), computed with Python integers.
    target = np.dtype(ml_dtypes.bfloat16) if device_dtype == "bfloat16" else np.dtype(device_dtype)
    # Overflow to inf is the float rule, and numpy's float -> int overflow is not used (below):
    # neither is worth a warning.
    with np.errstate(over="ignore", invalid="ignore"):
        on_device = x.astype(target)
    integral = "iub"  # numpy kinds of bool and integers (ml_dtypes' bfloat16 is kind "V")
    if x.dtype.kind in "iu" and on_device.dtype.kind not in integral:
        expected = saturating_float_to_int(on_device, x.dtype)  # int -> float -> int
    elif x.dtype.kind in integral or target.kind not in "iu":
        expected = on_device.astype(x.dtype)  # wrapping int casts, or float legs only
    else:
        expected = saturating_float_to_int(x, target).astype(x.dtype)  # float -> int -> float
    np.testing.assert_array_equal(stored, expected)


def saturating_float_to_int(values, int_dtype):
    info = np.iinfo(int_dtype)
    flat = [
        0 if np.isnan(v) else info.max if v == np.inf else info.min if v == -np.inf
        else min(max(int(v), info.min), info.max)
        for v in np.asarray(values, dtype=np.float64).ravel()
    ]
    return np.array(flat, dtype=int_dtype).reshape(np.shape(values))
