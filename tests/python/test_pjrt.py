"""The pjrt backend from Python: devices of a PJRT plugin (the XLA CPU plugin here), puts and
reads of strided and converting sources, sharding over its devices, and DLPack export without a
copy. Every device-parametrised test of the suite runs on pjrt:0 as well (conftest.py); these
are the pjrt-specific ones. Skipped, with the reason, where no plugin is installed."""

import numpy as np
import pytest

import ferry
from conftest import skip_or_fail_unavailable


def _pjrt_devices():
    try:
        return ferry.devices("pjrt")
    except ferry.Error as error:
        skip_or_fail_unavailable(f"no pjrt backend here: {error}")


def test_pjrt_devices_describe_their_plugin():
    devices = _pjrt_devices()
    assert devices[0].name == "pjrt:0"
    assert devices[0].backend == "pjrt"
    assert "PJRT" in devices[0].description and "API 0." in devices[0].description
    assert "float64" in devices[0].dtypes and "bfloat16" in devices[0].dtypes


def test_memory_stats_say_who_counted():
    # The CPU plugin keeps no allocator statistics (PJRT_Device_MemoryStats is UNIMPLEMENTED), so
    # its devices report ferry's own count; the host device always does.
    for device in (_pjrt_devices()[0], ferry.devices("host")[0]):
        a = ferry.device_put(np.ones((100, 10), np.float32), device)
        stats = device.memory_stats()
        assert stats["source"] == "ferry", (device.name, stats)
        assert stats["bytes_in_use"] == device.bytes_in_use >= a.nbytes
        del a
    assert "staging" in _pjrt_devices()[0].description


def test_strided_and_converting_puts_round_trip_on_pjrt():
    device = _pjrt_devices()[0]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((65, 130))
    for view in (x, x.T, x[::2, ::-3], x[:, 5:90]):
        a = ferry.device_put(view, device)
        np.testing.assert_array_equal(ferry.device_get(a), view)
        b = ferry.device_put(view, device, device_dtype="float32", semantics="async")
        np.testing.assert_array_equal(ferry.device_get(b), view.astype(np.float32).astype(np.float64))


def test_sharding_over_pjrt_devices():
    devices = _pjrt_devices()
    if len(devices) < 4:
        pytest.skip(f"the plugin presents {len(devices)} devices; the test needs 4")
    mesh = ferry.Mesh(devices[:4], (2, 2), ("rows", "cols"))
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    s = ferry.device_put(x, ferry.Sharding(mesh, ("rows", "cols")))
    np.testing.assert_array_equal(ferry.device_get(s), x)
    shards = s.local_shards()
    assert [shard.device.name for shard in shards] == [d.name for d in devices[:4]]
    np.testing.assert_array_equal(shards[3].data, x[4:, 3:])


def test_dlpack_export_of_a_pjrt_array_is_zero_copy():
    torch = pytest.importorskip("torch")
    device = _pjrt_devices()[0]
    if "direct host access" not in device.description:
        pytest.skip("the plugin's memory is not host-addressable here")
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = ferry.device_put(x, device)
    assert a.__dlpack_device__() == (1, 0)
    first = torch.from_dlpack(a)
    second = torch.from_dlpack(a)
    np.testing.assert_array_equal(first.numpy(), x)
    # Two exports of one array share its device memory: no copy was made.
    assert first.data_ptr() == second.data_ptr()
    np.testing.assert_array_equal(np.from_dlpack(a), x)


def test_device_put_places_arrays_in_the_memory_space_asked_for():
    device = _pjrt_devices()[0]
    assert device.memory_kinds[0] == "device" and "pinned_host" in device.memory_kinds
    x = np.arange(6 * 40, dtype=np.float64).reshape(6, 40)[:, ::3]  # strided, converted below
    a = ferry.device_put(x, device, memory_kind="pinned_host", device_dtype="float32")
    assert a.memory_kind == "pinned_host"
    np.testing.assert_array_equal(a.to_numpy(), x)
    assert ferry.device_put(x, device).memory_kind == "device"
    with pytest.raises(ferry.InvalidArgumentError, match="no memory space 'nowhere'"):
        ferry.device_put(x, device, memory_kind="nowhere")
