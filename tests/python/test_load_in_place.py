"""load_file onto a host device reads the tensors stored as they are kept straight from the file
into device memory (pread; docs/files.md, "Reading in place"), and `import ferry` plus such a load
never import ml_dtypes (half a second of a fresh process's load)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import ferry
from conftest import skip_or_fail_unavailable

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")


def _in_place_bytes() -> float:
    return ferry.metrics().get("FileBytesReadInPlace", 0.0)


@pytest.fixture
def checkpoint(tmp_path):
    """A file with large float32 and bfloat16 tensors, a large int64 one and a small one."""
    rng = np.random.default_rng(5)
    tensors = {
        "w": rng.standard_normal((256, 512)).astype(np.float32),               # 512 KiB
        "h": rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16),       # 128 KiB
        "ids": np.arange(16384, dtype=np.int64).reshape(2, 8192),              # 128 KiB
        "norm": np.ones(32, np.float32),                                       # 128 bytes
    }
    path = str(tmp_path / "model.safetensors")
    ferry.save_file(tensors, path)
    return path, tensors


def test_large_tensors_are_read_in_place_and_equal_the_file(checkpoint):
    path, tensors = checkpoint
    before = _in_place_bytes()
    loaded = ferry.load_file(path, "host:0")
    counted = _in_place_bytes() - before
    assert counted == tensors["w"].nbytes + tensors["h"].nbytes + tensors["ids"].nbytes
    for name, expected in tensors.items():
        got = np.asarray(loaded[name])
        assert got.dtype == expected.dtype, name
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), name


def test_conversions_and_other_devices_take_the_mapped_path(checkpoint):
    path, tensors = checkpoint
    before = _in_place_bytes()
    loaded = ferry.load_file(path, "host:0", device_dtype="float16")
    # w and h are converted (the mapped path); ids keeps its dtype and is read in place.
    assert _in_place_bytes() - before == tensors["ids"].nbytes
    assert loaded["w"].device_dtype == "float16"
    np.testing.assert_array_equal(np.asarray(loaded["w"]),
                                  tensors["w"].astype(np.float16).astype(np.float32))
    # A selection reads only what it names.
    before = _in_place_bytes()
    only = ferry.load_file(path, "host:0", names=["w"])
    assert list(only) == ["w"] and _in_place_bytes() - before == tensors["w"].nbytes


def test_a_device_the_host_cannot_write_reads_nothing_in_place(checkpoint):
    path, tensors = checkpoint
    try:
        device = ferry.device("opencl:0")
    except ferry.Error as error:
        skip_or_fail_unavailable(f"no OpenCL device: {error}")
    before = _in_place_bytes()
    loaded = ferry.load_file(path, device)
    assert _in_place_bytes() == before
    assert np.array_equal(np.asarray(loaded["w"]), tensors["w"])


def test_import_and_a_torch_load_do_not_import_ml_dtypes(checkpoint):
    path, _ = checkpoint
    script = (
        "import sys, ferry\n"
        "assert 'ml_dtypes' not in sys.modules, 'import ferry imported ml_dtypes'\n"
        f"arrays = ferry.load_file({path!r}, 'host:0')\n"
        "assert 'ml_dtypes' not in sys.modules, 'load_file(host:0) imported ml_dtypes'\n"
        "assert arrays['h'].dtype == 'bfloat16'\n"
        "import numpy as np\n"
        "assert np.asarray(arrays['h']).dtype.name == 'bfloat16'  # numpy needs it: imported now\n"
        "assert 'ml_dtypes' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(os.environ), timeout=120)
    assert result.returncode == 0, result.stderr
