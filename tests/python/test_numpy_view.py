"""numpy without a copy (issue 24 point 6): numpy.asarray of an Array in host-addressable memory,
stored in its own dtype, is a read-only view of the device memory that keeps it alive (delete()
included); numpy.array copies; copy=False works where a view is possible and raises ValueError
where it is not (a converted or sharded array, memory the host cannot address)."""

import gc

import ml_dtypes
import numpy as np
import pytest

import ferry


def dlpack_address(a):
    return np.from_dlpack(a).ctypes.data


def test_asarray_is_a_read_only_view_of_the_device_memory():
    x = np.random.default_rng(5).standard_normal((3, 4))
    a = ferry.device_put(x, "host:0")
    view = np.asarray(a)
    np.testing.assert_array_equal(view, x)
    assert view.ctypes.data == dlpack_address(a) != x.ctypes.data  # the device's memory
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 1.0
    assert np.asarray(a, copy=False).ctypes.data == view.ctypes.data
    assert np.array(a, copy=False).ctypes.data == view.ctypes.data


def test_array_copies_by_default_and_when_asked():
    x = np.arange(6.0)
    a = ferry.device_put(x, "host:0")
    for copied in (np.array(a), np.asarray(a, copy=True), a.to_numpy()):
        assert copied.flags.writeable and copied.ctypes.data != dlpack_address(a)
        np.testing.assert_array_equal(copied, x)
    # Another dtype than the array's is a copy, converted; with copy=False it is refused.
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float32), x.astype(np.float32))
    with pytest.raises(ValueError, match="not the float32 asked for"):
        np.asarray(a, dtype=np.float32, copy=False)


def test_the_view_keeps_the_memory_alive_after_delete():
    x = np.arange(1000.0)
    a = ferry.device_put(x, "host:0")
    view = np.asarray(a)[10:20]  # a view of the view: numpy's base chain holds the owner
    ferry.reset_metrics()
    a.delete()
    del a
    gc.collect()
    assert ferry.metrics().get("DestroyDataHandles", 0) == 0  # the view still holds it
    for _ in range(4):  # memory freed under the view would be reused (and overwritten) here
        ferry.device_put(np.full(1000, -1.0), "host:0").block_until_ready()
    np.testing.assert_array_equal(view, x[10:20])
    del view
    gc.collect()
    assert ferry.metrics()["DestroyDataHandles"] >= 1  # the last view gone: the handle is freed


def test_a_converted_array_is_copied_and_copy_false_says_why():
    x = np.array([1.5, -2.25, 3.0])
    a = ferry.device_put(x, "host:0", device_dtype="bfloat16")
    got = np.asarray(a)
    assert got.dtype == np.float64 and got.flags.writeable
    np.testing.assert_array_equal(got, x)  # these values are exact in bfloat16
    with pytest.raises(ValueError, match="stores it as bfloat16, not as its float64"):
        np.asarray(a, copy=False)


def test_a_bfloat16_array_stored_as_bfloat16_is_viewed_as_bfloat16():
    x = np.array([1.0, -0.5, 2.0], dtype=ml_dtypes.bfloat16)
    a = ferry.device_put(x, "host:0")
    view = np.asarray(a, copy=False)
    assert view.dtype == ml_dtypes.bfloat16 and not view.flags.writeable
    np.testing.assert_array_equal(view.astype(np.float32), x.astype(np.float32))


def test_a_sharded_array_is_assembled_into_a_copy():
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    x = np.arange(8.0).reshape(4, 2)
    a = ferry.device_put(x, ferry.Sharding(mesh, ("x", None)))
    np.testing.assert_array_equal(np.asarray(a), x)
    with pytest.raises(ValueError, match="sharded"):
        np.asarray(a, copy=False)


def test_every_backend_views_where_the_host_addresses_the_memory_and_copies_elsewhere(device):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = ferry.device_put(x, device)
    try:
        host_addressable = a.__dlpack_device__() == (1, 0)
    except ferry.UnimplementedError:
        host_addressable = False  # memory without an address (opencl)
    if host_addressable and a.device_dtype == "float32":
        view = np.asarray(a, copy=False)
        assert not view.flags.writeable and view.ctypes.data == dlpack_address(a)
        np.testing.assert_array_equal(view, x)
    else:
        np.testing.assert_array_equal(np.asarray(a), x)
        with pytest.raises(ValueError, match="without a copy"):
            np.asarray(a, copy=False)
