"""A tensor file truncated while it is mapped: an error naming the file, never SIGBUS.

Each scenario runs in a subprocess (with a timeout): without the fix the process dies of SIGBUS,
which must fail the test rather than the test run.
"""

import signal

import pytest

from conftest import run_python


@pytest.mark.parametrize("semantics", ["copy", "async"])
def test_a_put_from_a_truncated_mapping_raises_naming_the_file(tmp_path, semantics):
    path = tmp_path / "weights.safetensors"
    code = f"""
    import os
    import numpy as np
    import ferry
    path = {str(path)!r}
    ferry.save_file({{"a": np.ones((1024, 1024), np.float32), "b": np.ones((1024, 1024), np.float32)}}, path)
    tensors = ferry.open_file(path)            # mapped, not read yet
    os.truncate(path, 4096)                    # the data pages vanish under the mapping
    try:
        arrays = ferry.device_put([tensors["a"], tensors["b"]], semantics="{semantics}")
        ferry.device_get(arrays)
        print("no error")
    except ferry.Error as error:
        print(type(error).__name__, error)
    # The process is healthy afterwards: a new file goes and comes back.
    ok = ferry.device_get(ferry.device_put(np.arange(1 << 20, dtype=np.float32)))
    print("after", int(ok[-1]))
    """
    result = run_python(code, timeout=60)
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert result.returncode == 0, result.stderr
    assert "DataLossError" in result.stdout, result.stdout
    assert "weights.safetensors' was truncated while it was mapped" in result.stdout
    assert "after 1048575" in result.stdout


def test_load_file_of_a_file_truncated_after_opening_raises(tmp_path):
    path = tmp_path / "m.npy"
    code = f"""
    import os
    import numpy as np
    import ferry
    path = {str(path)!r}
    np.save(path, np.ones((2048, 1024), np.float32))
    f = ferry.open_file(path)
    os.truncate(path, 0)
    try:
        ferry.device_put(f["m"], device_dtype="bfloat16")
        print("no error")
    except ferry.Error as error:
        print(type(error).__name__, error)
    """
    result = run_python(code, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "DataLossError" in result.stdout and "m.npy" in result.stdout, result.stdout
