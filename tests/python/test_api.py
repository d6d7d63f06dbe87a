"""The Python API: devices, device_put/device_get semantics, dtypes, errors, DLPack, metrics."""

import threading

import ml_dtypes
import numpy as np
import pytest

import ferry
from conftest import skip_or_fail_unavailable


def test_devices_and_device_lookup():
    devices = ferry.devices("host")
    assert [d.name for d in devices] == [f"host:{i}" for i in range(8)]  # FERRY_HOST_DEVICES
    host = ferry.device("host:0")
    assert host == devices[0]
    assert host.backend == "host" and host.index == 0
    assert host.memory_limit is None
    assert "bfloat16" in host.dtypes and "float64" in host.dtypes
    assert host in ferry.devices()


def test_a_single_process_names_devices_without_a_process():
    # In a job of several processes a device's name in the job is "p1/host:0" (test_distributed.py);
    # alone, every name is the device's own, as before.
    host = ferry.device("host:1")
    assert (host.name, host.global_name, repr(host)) == ("host:1", "host:1", "Device(host:1)")
    assert [d.global_name for d in ferry.global_devices()] == [d.name for d in ferry.devices("host")]
    assert repr(ferry.device_put(np.arange(3.0), host)).endswith("device=host:1)")


def test_unknown_devices_raise_matching_errors():
    with pytest.raises(ferry.NotFoundError):
        ferry.device("host:8")
    with pytest.raises(ferry.NotFoundError):
        ferry.devices("tpu")
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.device("host:x")


def test_put_get_round_trip(device):
    x = np.random.default_rng(0).standard_normal((17, 33)).astype(np.float32)
    a = ferry.device_put(x, device)
    assert a.shape == (17, 33) and a.dtype == np.float32 and a.device == device
    assert a.device_dtype == "float32"
    assert a.block_until_ready() is a and a.is_ready()
    np.testing.assert_array_equal(ferry.device_get(a), x)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert "float32" in repr(a) and device.name in repr(a)


def test_copy_semantics_ignore_later_writes(device):
    x = np.arange(1 << 18, dtype=np.float32)
    a = ferry.device_put(x, device)  # semantics="copy"
    x[...] = 0
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1 << 18, dtype=np.float32))


def test_async_and_zero_copy_semantics_deliver_the_data(device):
    x = np.arange(100000, dtype=np.int64).reshape(100, 1000)[:, ::3]
    for semantics in ("async", "zero_copy"):
        a = ferry.device_put(x, device, semantics=semantics)
        np.testing.assert_array_equal(a.to_numpy(), x)


def test_zero_copy_aliases_dense_aligned_arrays_on_the_host():
    ferry.reset_metrics()
    # numpy aligns its allocations to 16 bytes only: take a 64-byte-aligned slice of a larger one.
    storage = np.zeros(4096 + 16, dtype=np.float32)
    start = (-storage.ctypes.data % 64) // storage.itemsize
    x = storage[start:start + 4096]
    assert x.ctypes.data % 64 == 0
    a = ferry.device_put(x, "host:0", semantics="zero_copy")
    assert ferry.metrics()["ZeroCopyAliases"] == 1
    np.testing.assert_array_equal(a.to_numpy(), x)


def test_device_dtype_keeps_logical_dtype(device):
    x = np.linspace(-3, 3, 64).reshape(8, 8)  # float64
    a = ferry.device_put(x, device, device_dtype="bfloat16")
    assert a.dtype == np.float64 and a.device_dtype == "bfloat16"
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(a.to_numpy(), expected)
    b = ferry.device_put(x, device, device_dtype=ml_dtypes.bfloat16)
    assert b.device_dtype == "bfloat16"


def test_bfloat16_and_float8_numpy_arrays_keep_their_dtype(device):
    for dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        x = np.arange(-8, 8, dtype=np.float32).astype(dtype).reshape(4, 4).T
        a = ferry.device_put(x, device)
        assert a.dtype == np.dtype(dtype) and a.device_dtype == np.dtype(dtype).name
        out = a.to_numpy()
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(x).view(np.uint8))


def test_list_put_is_one_batched_call_and_get_returns_a_list(device):
    ferry.reset_metrics()
    xs = [np.full((4, 4), i, dtype=np.int32) for i in range(10)]
    arrays = ferry.device_put(xs, device)
    assert isinstance(arrays, list) and len(arrays) == 10
    assert ferry.metrics()["TransferToDeviceTime.count"] == 1
    outs = ferry.device_get(arrays)
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out, x)
    # A pytree keeps its structure, as in JAX: a tuple comes back a tuple.
    assert isinstance(ferry.device_put(tuple(xs), device), tuple)


def test_a_large_batch_of_small_arrays_is_copied_during_the_call(device):
    # 300 arrays of 128 KiB (38 MiB in all, past the size where a "copy" put of large arrays
    # turns into an interruptible asynchronous one): small arrays are copied during the call, on
    # every core, and each is read before the call returns, as "copy" promises.
    ferry.reset_metrics()
    xs = [np.full((32, 1024), i, dtype=np.float32) for i in range(300)]
    arrays = ferry.device_put(xs, device)
    assert isinstance(arrays, list) and len(arrays) == 300
    assert ferry.metrics()["TransferToDeviceTime.count"] == 1
    for x in xs:
        x.fill(-1)  # the sources may change now
    for i, out in enumerate(ferry.device_get(arrays)):
        assert out.shape == (32, 1024) and (out == i).all(), i
    # A list mixing in other leaves takes the pytree path, with the same result.
    mixed = ferry.device_put([np.arange(3), 2.5, np.float32(1)], device)
    assert [m.to_numpy().tolist() for m in mixed] == [[0, 1, 2], 2.5, 1.0]


def test_buffer_protocol_objects(device):
    data = bytearray(range(16))
    a = ferry.device_put(memoryview(data), device)
    assert a.dtype == np.uint8
    np.testing.assert_array_equal(a.to_numpy(), np.arange(16, dtype=np.uint8))
    m = memoryview(np.arange(6, dtype=np.float64).reshape(2, 3))
    np.testing.assert_array_equal(ferry.device_put(m, device).to_numpy(), np.arange(6.0).reshape(2, 3))


def test_errors_are_typed_and_name_the_problem(device):
    with pytest.raises(ferry.InvalidArgumentError, match="imaginary"):
        ferry.device_put(np.zeros(3, dtype=np.complex64), device, device_dtype="float32")
    with pytest.raises(ferry.InvalidArgumentError, match="unreadable"):
        ferry.device_put(np.zeros(3, dtype=np.float32), device, device_dtype="complex64")
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        ferry.device_put(np.zeros(3), device, semantics="sometimes")
    with pytest.raises(ferry.InvalidArgumentError, match="structured|object"):
        ferry.device_put(np.array([object()]), device)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.device_put(np.zeros(2), device, device_dtype="float128")
    with pytest.raises(NotImplementedError):
        ferry.device_put(np.zeros(2, dtype=ml_dtypes.float8_e4m3fn), device, device_dtype="float32")
    with pytest.raises(ferry.InvalidArgumentError, match="neither a buffer"):
        ferry.device_put(object(), device)  # (a Python scalar is a 0-d array: test_array_api.py)


def test_big_endian_arrays_are_swapped_on_the_way(device):
    # Read through their real strides and swapped by the copy-convert: no astype needed.
    rng = np.random.default_rng(7)
    for dtype in (">f4", ">i8", ">c8", ">f8"):
        x = rng.standard_normal((12, 9)).astype(dtype)
        for source in (x, x[::2, 1::3], x.T):
            got = ferry.device_put(source, device).to_numpy()
            assert got.dtype.byteorder in ("=", "<", "|")
            np.testing.assert_array_equal(got, source)
    x = rng.standard_normal(1000).astype(">f4")
    got = ferry.device_put(x, device, device_dtype="bfloat16").to_numpy()
    np.testing.assert_array_equal(got, x.astype("<f4").astype(ml_dtypes.bfloat16).astype("<f4"))


def test_deleted_arrays_raise(device):
    a = ferry.device_put(np.zeros(3), device)
    a.delete()
    assert "deleted" in repr(a)
    with pytest.raises(ferry.FailedPreconditionError):
        a.to_numpy()


def test_memory_exhaustion_is_memory_error():
    from conftest import run_python
    result = run_python(
        """
        import numpy as np, ferry
        keep = ferry.device_put(np.ones(1000, np.float64))
        try:
            ferry.device_put(np.ones(1 << 20, np.float64))
        except MemoryError as e:
            print("MemoryError", type(e).__name__)
        print(ferry.device_get(keep).sum())
        """,
        timeout=60,
        env={"FERRY_HOST_MEMORY_LIMIT": str(1 << 20)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["MemoryError", "ResourceExhaustedError", "1000.0"]


def test_torch_tensors_go_in_through_dlpack_with_their_strides(device):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for view in (t, t.T, t[::2, 1::2], t.to(torch.bfloat16).T):
        a = ferry.device_put(view, device)
        expected = view.float().numpy() if view.dtype == torch.bfloat16 else view.numpy()
        if view.dtype == torch.bfloat16:
            assert a.dtype == np.dtype(ml_dtypes.bfloat16) and a.device_dtype == "bfloat16"
            np.testing.assert_array_equal(a.to_numpy().astype(np.float32), expected)
        else:
            np.testing.assert_array_equal(a.to_numpy(), expected)


def test_jax_arrays_go_in_through_dlpack():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    np.testing.assert_array_equal(ferry.device_put(x).to_numpy(), np.asarray(x))


def test_host_arrays_export_dlpack_zero_copy():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import jax.dlpack

    a = ferry.device_put(np.arange(8, dtype=np.float32))
    assert a.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(a)
    np.testing.assert_array_equal(t.numpy(), np.arange(8, dtype=np.float32))
    j = jax.dlpack.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(j), np.arange(8, dtype=np.float32))
    # Zero-copy: two imports see the same memory.
    assert torch.from_dlpack(a).data_ptr() == t.data_ptr()
    b = ferry.device_put(torch.arange(4, dtype=torch.bfloat16))
    assert torch.equal(torch.from_dlpack(b), torch.arange(4, dtype=torch.bfloat16))


def test_host_devices_have_one_memory_space():
    device = ferry.device("host:0")
    assert device.memory_kinds == ["device"]
    a = ferry.device_put(np.ones(3, np.float32), device, memory_kind="device")
    assert a.memory_kind == "device"
    with pytest.raises(ferry.InvalidArgumentError, match="it has: device"):
        ferry.device_put(np.ones(3, np.float32), device, memory_kind="pinned_host")


def test_dlpack_export_says_where_the_memory_is_or_why_it_cannot():
    a = ferry.device_put(np.arange(8, dtype=np.float32))
    # A consumer that asks for another device, or a stream on host memory, is refused.
    with pytest.raises(BufferError, match=r"cannot export to device \(2, 0\)"):
        a.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="no streams"):
        a.__dlpack__(stream=1)
    try:
        opencl = ferry.devices("opencl")[0]
    except ferry.Error as error:
        skip_or_fail_unavailable(f"no opencl device on this machine: {error}")
    b = ferry.device_put(np.arange(8, dtype=np.float32), opencl)
    # OpenCL memory has no address a consumer could read (a cl_mem is not a pointer).
    with pytest.raises(ferry.UnimplementedError, match="no address"):
        b.__dlpack_device__()
    with pytest.raises(ferry.UnimplementedError, match="no address"):
        b.__dlpack__()


def test_from_dlpack_imports_torch_without_a_copy():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ferry.reset_metrics()
    t = torch.arange(1024, dtype=torch.float32)
    if t.data_ptr() % 64:
        pytest.skip("torch did not 64-byte-align this allocation")
    a = ferry.from_dlpack(t)
    assert ferry.metrics()["ZeroCopyAliases"] == 1
    np.testing.assert_array_equal(a.to_numpy(), t.numpy())


def test_metrics_and_report():
    ferry.reset_metrics()
    arrays = ferry.device_put([np.ones(10), np.ones(20, np.float32)])
    ferry.device_get(arrays)
    m = ferry.metrics()
    assert m["CreateDataHandles"] == 2
    assert m["OutboundData.sum"] == 10 * 8 + 20 * 4
    report = ferry.metrics_report()
    assert "Metric: TransferToDeviceTime" in report and "Counter: CreateDataHandles" in report


def test_concurrent_python_threads(device):
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            x = rng.standard_normal((64, 64))
            a = ferry.device_put(x, device, semantics="async")
            if not np.array_equal(ferry.device_get(a), x):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
