"""Reads into the caller's memory: device_get(out=...) and Array.copy_to_host_async(out=...), on
every backend, into strided numpy arrays, with every argument checked before any byte is written."""

import asyncio
import gc
import weakref

import ml_dtypes
import numpy as np
import pytest

import ferry

SEED = 28005


def strided_out(rng, shape, dtype):
    """A writable numpy view of `shape` with other strides than row-major: transposed, stepped
    and (for 2-d) negative, inside a larger buffer filled with a known pattern."""
    big = np.full(tuple(2 * n + 1 for n in shape[::-1]), 77, dtype=dtype)
    view = big.T  # transposed
    view = view[tuple(slice(None, 2 * n, 2) for n in shape)]  # stepped
    if len(shape) == 2:
        view = view[::-1]  # negative stride on the first dim
    assert view.shape == tuple(shape) and not view.flags.c_contiguous
    return big, view


@pytest.mark.parametrize("dtype", [np.float32, np.int16, ml_dtypes.bfloat16, np.complex64])
def test_device_get_out_writes_a_strided_view_in_place(device, dtype):
    if np.dtype(dtype).name not in device.dtypes:
        pytest.skip(f"{device.name} does not hold {np.dtype(dtype).name}")
    rng = np.random.default_rng(SEED)
    x = (rng.standard_normal((7, 5)) * 100).astype(dtype)
    a = ferry.device_put(x, device)
    big, out = strided_out(rng, x.shape, dtype)
    before = big.copy()
    result = ferry.device_get(a, out=out)
    assert result is out
    np.testing.assert_array_equal(out, x)
    # Only the view's elements changed: the rest of the larger buffer is untouched.
    touched = np.zeros(big.shape, bool)
    touched.T[tuple(slice(None, 2 * n, 2) for n in x.shape)] = True
    np.testing.assert_array_equal(big[~touched], before[~touched])


def test_device_get_out_reads_the_logical_dtype_of_a_converted_array(device):
    x = np.random.default_rng(SEED).standard_normal((4, 6))
    a = ferry.device_put(x, device, device_dtype="float32")
    out = np.empty((6, 4), np.float64).T
    ferry.device_get(a, out=out)
    np.testing.assert_array_equal(out, x.astype(np.float32).astype(np.float64))


def test_device_get_out_matches_a_pytree_by_key_and_position(device):
    rng = np.random.default_rng(SEED)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.integers(0, 9, 5).astype(np.int32)
    tree = ferry.device_put({"w": w, "layers": [b, None]}, device)
    out = {"layers": [np.zeros(5, np.int32), None], "w": np.zeros((3, 4), np.float32)}
    assert ferry.device_get(tree, out=out) is out
    np.testing.assert_array_equal(out["w"], w)
    np.testing.assert_array_equal(out["layers"][0], b)
    assert out["layers"][1] is None


def test_device_get_out_of_a_sharded_array_assembles_into_the_view():
    mesh = ferry.Mesh(ferry.devices("host")[:4], (2, 2), ("x", "y"))
    x = np.arange(9 * 7, dtype=np.float32).reshape(9, 7)
    a = ferry.device_put(x, ferry.Sharding(mesh, ("x", "y")))
    out = np.zeros((7, 9), np.float32).T
    ferry.device_get(a, out=out)
    np.testing.assert_array_equal(out, x)


def test_device_get_out_errors_name_the_problem_and_write_nothing(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = ferry.device_put(x, device)
    b = ferry.device_put(x + 1, device)
    cases = [
        (np.zeros((4, 3), np.float32), r"out has shape \(4, 3\), the array \(3, 4\)"),
        (np.zeros((3, 4), np.float64), "out has dtype float64, the array float32"),
        (np.zeros((3, 4), ">f4"), "out has dtype >f4"),
        ([0.0] * 12, "out is a list"),
        (np.broadcast_to(np.zeros(4, np.float32), (3, 4)), "out is read-only"),
    ]
    for out, message in cases:
        with pytest.raises(ferry.InvalidArgumentError, match=message):
            ferry.device_get(a, out=out)
    # In a batch, a bad second destination fails the call before the first is written.
    good = np.full((3, 4), -1, np.float32)
    with pytest.raises(ferry.InvalidArgumentError, match=r"out\[1\] has shape"):
        ferry.device_get([a, b], out=[good, np.zeros(12, np.float32)])
    assert (good == -1).all()
    with pytest.raises(ferry.InvalidArgumentError, match=r"out\[1\] is the same numpy array"):
        ferry.device_get([a, b], out=[good, good])
    assert (good == -1).all()
    # Elements sharing bytes (a writable zero-stride or overlapping-rows view): which value would
    # land there is a race between the read's threads, so it is refused before anything is written.
    backing = np.full(16, -1, np.float32)
    for strides in [(0, 4), (4, 4)]:
        overlapping = np.lib.stride_tricks.as_strided(backing, (3, 4), strides, writeable=True)
        with pytest.raises(ferry.InvalidArgumentError, match="same bytes"):
            ferry.device_get(a, out=overlapping)
    assert (backing == -1).all()
    with pytest.raises(ferry.InvalidArgumentError, match="list or tuple of 2 entries"):
        ferry.device_get([a, b], out=[good])
    with pytest.raises(ferry.InvalidArgumentError, match="keys"):
        ferry.device_get({"a": a}, out={"b": good})


def test_copy_to_host_async_out_reads_in_the_background_then_lets_out_go(device):
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    a = ferry.device_put(x, device, semantics="async")
    out = np.empty((33, 64), np.float32).T
    read = a.copy_to_host_async(out=out)
    assert isinstance(read, ferry.HostRead) and read.out is out
    del a  # the read holds the device data
    gc.collect()
    result = read.wait()
    assert read.is_ready() and result is out
    np.testing.assert_array_equal(result, x)
    assert read.wait() is result  # waiting again returns the same array
    # Once the read is over and the caller lets go, nothing of ferry's holds `out` any more.
    probe = weakref.ref(out.base)
    del out, result, read
    gc.collect()
    ferry.devices("host")  # an API call: releases what runtime threads let go of
    assert probe() is None


def test_copy_to_host_async_out_is_awaitable(device):
    x = np.arange(10, dtype=np.int32)
    a = ferry.device_put(x, device)
    out = np.zeros(10, np.int32)

    async def main():
        return await a.copy_to_host_async(out=out)

    assert asyncio.run(main()) is out
    np.testing.assert_array_equal(out, x)


def test_copy_to_host_async_out_checks_out_before_reading(device):
    a = ferry.device_put(np.arange(6, dtype=np.float32), device)
    with pytest.raises(ferry.InvalidArgumentError, match="copy_to_host_async: out has dtype"):
        a.copy_to_host_async(out=np.zeros(6, np.int32))
    # Without out: None, and the next to_numpy takes the copy it started.
    assert a.copy_to_host_async() is None
    np.testing.assert_array_equal(a.to_numpy(), np.arange(6, dtype=np.float32))


def test_reads_into_a_deleted_array_are_refused(device):
    a = ferry.device_put(np.ones(3, np.float32), device)
    a.delete()
    with pytest.raises(ferry.FailedPreconditionError, match="deleted"):
        ferry.device_get(a, out=np.zeros(3, np.float32))


def test_delete_lets_go_of_the_host_copy_of_copy_to_host_async():
    # The host copy belongs to the array: delete() gives back its memory with the device memory
    # (it stayed held until the Array object itself was dropped). Both go to ferry's cache of freed
    # host memory here, which tells.
    import time
    x = np.ones(1 << 23)   # 64 MiB
    a = ferry.device_put(x, "host:0").block_until_ready()
    ferry.reset_metrics()
    a.copy_to_host_async()
    deadline = time.monotonic() + 30
    while ferry.metrics().get("InboundData.count", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    cached = ferry.metrics()["HostMemoryCacheBytes"]
    a.delete()
    # The read's own callback may hold the copy a moment longer.
    deadline = time.monotonic() + 10
    while (ferry.metrics()["HostMemoryCacheBytes"] - cached < 2 * x.nbytes
           and time.monotonic() < deadline):
        time.sleep(0.005)
    assert ferry.metrics()["HostMemoryCacheBytes"] - cached >= 2 * x.nbytes
