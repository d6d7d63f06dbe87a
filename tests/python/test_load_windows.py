"""load_file puts a file window by window and gives each window's mapped pages back once put
(FERRY_LOAD_WINDOW_BYTES, ferry._files._release_file_pages), so that a load does not hold the file and
the device copy at once (docs/performance.md)."""

import numpy as np
import pytest

import ferry

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")


def _resident_bytes_at(address: int) -> int:
    """smaps' Rss of the mapping that holds `address` (this process's share of its pages)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not line.startswith(("VmFlags", "Name")):
                try:
                    begin, end = (int(part, 16) for part in head.split("-"))
                except ValueError:
                    continue
                inside = begin <= address < end
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the address")


def test_released_pages_leave_the_process_and_read_the_same(tmp_path):
    path = str(tmp_path / "big.safetensors")
    data = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    safetensors_numpy.save_file({"x": data}, path)
    view = ferry.open_file(path)["x"]
    address = view.__array_interface__["data"][0]
    assert float(view.sum(dtype=np.float64)) == float(data.sum(dtype=np.float64))  # all resident
    before = _resident_bytes_at(address)
    assert before >= 15 << 20
    ferry._files._release_file_pages(ferry._files._contiguous_ranges([view]))
    after = _resident_bytes_at(address)
    assert after <= before - (15 << 20), (before, after)
    # A window faulted in ahead (from 2 threads, without the GIL) is resident again.
    ferry._ferry._prefetch_mapped_pages(address, view.nbytes, 2)
    assert _resident_bytes_at(address) >= 15 << 20
    np.testing.assert_array_equal(view, data)  # faulted in again, the same bytes
    # Memory that is not a mapped file's is left alone.
    ferry._files._release_file_pages(ferry._files._contiguous_ranges([data]))
    assert data[-1] == (4 << 20) - 1


def test_a_load_over_many_windows_is_exact(tmp_path, request, device):
    rng = np.random.default_rng(3)
    tensors = {}
    for i in range(12):  # float and int tensors: a window holds both, two device dtypes
        tensors[f"f{i:02d}"] = rng.standard_normal((64, 33)).astype(np.float32)
        tensors[f"i{i:02d}"] = rng.integers(-50, 50, (17,), dtype=np.int32)
    path = str(tmp_path / "many.safetensors")
    safetensors_numpy.save_file(tensors, path)
    ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", 20_000)  # about two float tensors a window
    request.addfinalizer(lambda: ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", None))
    windows = list(ferry._files._load_windows(list(ferry.open_file(path)), ferry.open_file(path)))
    assert len(windows) >= 5
    assert any({n[0] for n in window} == {"f", "i"} for window in windows)  # two dtype groups
    narrow = "float16" if "float16" in device.dtypes else "bfloat16"  # PoCL has no half
    narrow_type = ferry._dtypes._NUMPY_DTYPES[narrow]
    loaded = ferry.load_file(path, device, device_dtype=narrow)
    assert list(loaded) == list(ferry.open_file(path))
    for name, value in tensors.items():
        got = ferry.device_get(loaded[name])
        assert got.dtype == value.dtype
        expected = value.astype(narrow_type).astype(np.float32) if value.dtype.kind == "f" else value
        np.testing.assert_array_equal(got, expected, err_msg=name)
        assert loaded[name].device_dtype == (narrow if value.dtype.kind == "f" else "int32")


def test_the_window_setting(tmp_path, request):
    request.addfinalizer(lambda: ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", None))
    arrays = {f"t{i}": np.zeros(1000, np.uint8) for i in range(10)}
    assert len(list(ferry._files._load_windows(list(arrays), arrays))) == 1  # 256 MiB by default
    ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", 2500)
    assert [len(w) for w in ferry._files._load_windows(list(arrays), arrays)] == [2, 2, 2, 2, 2]
    ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", 0)  # the whole file at once
    assert len(list(ferry._files._load_windows(list(arrays), arrays))) == 1
    with pytest.raises(ferry.InvalidArgumentError, match="FERRY_LOAD_WINDOW_BYTES"):
        ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", "lots")
