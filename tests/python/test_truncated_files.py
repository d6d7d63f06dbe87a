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


def test_numpy_reading_a_truncated_mapping_is_told_on_stderr(tmp_path):
    # numpy's own reads cannot raise: the vanished pages read as zeros (the process lives), and
    # ferry's fault handler says so on stderr, once per file, naming it and the first byte lost.
    path = tmp_path / "w.npy"
    code = f"""
    import os
    import numpy as np
    import ferry
    path = {str(path)!r}
    np.save(path, np.ones((2048, 1024), np.float32))
    arrays = ferry.load_file(path)             # numpy arrays over the mapping
    os.truncate(path, 4096)
    print("sum", float(arrays["w"].sum()))      # numpy reads the vanished pages itself
    print("again", float(arrays["w"][-1].sum()))
    """
    result = run_python(code, timeout=60)
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert result.returncode == 0, result.stderr
    # The first page (header and the first values) survived; everything after it reads zeros.
    assert "sum " in result.stdout and "again 0.0" in result.stdout, result.stdout
    notes = [line for line in result.stderr.splitlines() if line.startswith("ferry: file '")]
    assert len(notes) == 1, result.stderr
    assert (
        "w.npy' was truncated while it was mapped: reads of its bytes from byte 4096 on see zeros"
    ) in notes[0]


def test_each_array_answers_for_its_own_file_only(tmp_path):
    # Before: one process-wide counter, then every live mapping checked: once file a.npy was
    # truncated, an array of b.npy (put before or after) raised DataLossError naming a.npy.
    a_path, b_path = tmp_path / "a.npy", tmp_path / "b.npy"
    code = f"""
    import os
    import numpy as np
    import ferry
    np.save({str(a_path)!r}, np.ones((2048, 1024), np.float32))
    np.save({str(b_path)!r}, np.full((2048, 1024), 2.0, np.float32))
    a, b = ferry.open_file({str(a_path)!r}), ferry.open_file({str(b_path)!r})
    b_before = ferry.device_put(b["b"])
    os.truncate({str(a_path)!r}, 4096)
    try:
        ferry.device_get(ferry.device_put(a["a"]))
        print("a: no error")
    except ferry.DataLossError as error:
        print("a: DataLossError", "a.npy" in str(error))
    b_after = ferry.device_put(b["b"], semantics="async")
    print("b before", float(ferry.device_get(b_before).min()))
    print("b after", float(ferry.device_get(b_after).max()))
    print("b load", float(ferry.load_file({str(b_path)!r}, "host:0")["b"].to_numpy().mean()))
    """
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "a: DataLossError True" in result.stdout, result.stdout
    assert "b before 2.0" in result.stdout and "b after 2.0" in result.stdout, result.stdout
    assert "b load 2.0" in result.stdout, result.stdout


def test_a_cut_inside_a_tensors_last_page_is_data_loss_too(tmp_path):
    # Truncated inside the page that holds the tensor's end: no SIGBUS at all (the page stays
    # mapped and reads zeros past the cut), and the put used to get those zeros silently.
    path = tmp_path / "cut.safetensors"
    code = f"""
    import os
    import numpy as np
    import ferry
    path = {str(path)!r}
    ferry.save_file({{"a": np.arange(1, 65, dtype=np.float32)}}, path)
    f = ferry.open_file(path)
    os.truncate(path, os.path.getsize(path) - 100)
    for device in ("host:0", "pjrt:0"):
        try:
            back = ferry.device_get(ferry.device_put(f["a"], device))
            print(device, "no error", back[-30:])
        except ferry.DataLossError as error:
            print(device, "DataLossError", "was truncated" in str(error))
    """
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "host:0 DataLossError True" in result.stdout, result.stdout
    assert "pjrt:0 DataLossError True" in result.stdout, result.stdout


def test_faulthandler_enabled_after_the_file_was_opened_does_not_turn_a_cut_into_a_crash(tmp_path):
    # faulthandler, enabled after ferry's handler, re-raises the SIGBUS after putting ferry's
    # handler back; ferry used to answer that raise with the default action (death by SIGBUS).
    path = tmp_path / "big.safetensors"
    code = f"""
    import faulthandler, os
    import numpy as np
    import ferry
    path = {str(path)!r}
    ferry.save_file({{"a": np.ones(1 << 20, np.float32)}}, path)
    f = ferry.open_file(path)
    faulthandler.enable()
    os.truncate(path, 4096)
    print("sum", float(f["a"].sum()), flush=True)   # numpy reads the vanished pages: zeros
    try:
        ferry.device_put(f["a"])
    except ferry.DataLossError:
        print("DataLossError")
    """
    result = run_python(code, timeout=60)
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS"
    assert result.returncode == 0, result.stderr[-2000:]
    assert "DataLossError" in result.stdout, result.stdout



def test_a_sigbus_the_process_sends_itself_still_ends_it():
    # Sent, not a fault, with no mapped file cut: what it does without ferry (death by SIGBUS), not
    # swallowed by ferry's handler.
    code = """
    import os, signal
    import numpy as np
    import ferry, tempfile
    path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
    ferry.save_file({"a": np.zeros(1000, np.float32)}, path)
    f = ferry.open_file(path)
    signal.raise_signal(signal.SIGBUS)
    print("survived", flush=True)
    """
    result = run_python(code, timeout=60)
    assert result.returncode == -signal.SIGBUS, (result.returncode, result.stdout, result.stderr)
