"""The seed's deadlock, and proof that each GIL defence alone prevents it.

An "async" put of a temporary that only the transfer holds, at once followed by a blocking read:
the transfer's completion drops the last reference to the Python object on a runtime thread while
the main thread waits for that transfer. Each scenario runs in a subprocess with a timeout, so a
hang fails the test instead of stalling CI.
"""

import subprocess

import pytest

from conftest import DEVICE_NAMES, run_python

SCENARIO = """
import sys
import numpy as np
import ferry, ferry._testing as testing

testing.set_release_gil({release_gil})
testing.set_deferred_release({deferred_release})
device = ferry.device("{device}")
for i in range({repeats}):
    # 1 MiB: the transfer runs on a runtime thread, and only it holds the temporary.
    array = ferry.device_put({make_source}, device, semantics="async")
    out = ferry.device_get(array)
    if out[0, 0] != i or out[-1, -1] != i:
        sys.exit(f"wrong data at repeat {{i}}: {{out[0, 0]}}")
print("completed", {repeats})
"""

SOURCES = {
    "numpy": "np.full((256, 1024), i, dtype=np.float32)",
    "torch": "__import__('torch').full((256, 1024), float(i), dtype=__import__('torch').float32)",
}


def scenario(source, device, release_gil, deferred_release, repeats):
    return SCENARIO.format(
        make_source=SOURCES[source],
        device=device,
        release_gil=release_gil,
        deferred_release=deferred_release,
        repeats=repeats,
    )


@pytest.mark.parametrize("device", DEVICE_NAMES)
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize(
    "release_gil,deferred_release",
    [(True, True), (True, False), (False, True)],
    ids=["both_defences", "only_gil_release", "only_deferred_release"],
)
def test_async_put_then_blocking_read_never_hangs(source, device, release_gil, deferred_release):
    result = run_python(scenario(source, device, release_gil, deferred_release, 1000), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "completed 1000" in result.stdout


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_without_either_defence_the_scenario_deadlocks(source):
    # Proves the test above can fail: with both defences off the subprocess hangs and is killed.
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(scenario(source, "host:0", False, False, 100000), timeout=20)


def test_gil_is_restored_when_a_released_call_fails():
    code = """
    import threading
    import numpy as np
    import ferry
    big = np.ones(1 << 19, dtype=np.float32)   # 2 MiB: the put releases the GIL, then fails
    for _ in range(50):
        try:
            ferry.device_put(big)
        except ferry.ResourceExhaustedError:
            pass
        else:
            raise SystemExit("expected ResourceExhaustedError")
    # Another thread can still take the GIL, and this one still holds it after the error.
    seen = []
    t = threading.Thread(target=lambda: seen.append(1))
    t.start(); t.join()
    print("ok", seen)
    """
    result = run_python(code, timeout=60, env={"FERRY_HOST_MEMORY_LIMIT": str(1 << 20)})
    assert result.returncode == 0, result.stderr
    assert "ok [1]" in result.stdout


@pytest.mark.parametrize("deferred_release", [True, False])
def test_python_sources_are_released_on_the_main_thread_only_when_deferred(deferred_release):
    code = f"""
    import threading, weakref
    import numpy as np
    import ferry, ferry._testing as testing
    testing.set_deferred_release({deferred_release})
    main = threading.get_ident()
    threads = []
    for i in range(200):
        x = np.full((256, 1024), i, dtype=np.float32)
        weakref.finalize(x, lambda: threads.append(threading.get_ident()))
        a = ferry.device_put(x, semantics="async")
        del x   # only the transfer holds the array now
        a.block_until_ready()
        ferry.metrics()   # an API entry drains whatever is still queued
    off_main = sum(t != main for t in threads)
    print(len(threads), off_main)
    """
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    released, off_main = map(int, result.stdout.split())
    assert released == 200
    if deferred_release:
        assert off_main == 0  # every release ran under the GIL on the main thread
    else:
        assert off_main > 0  # without the queue, runtime threads take the GIL themselves


def test_a_small_widening_copy_put_releases_the_gil_while_it_waits_for_staging():
    # Defence 1 alone (defence 2 off): an async put whose completion needs the GIL, then a
    # "copy" put of a 200 KiB float32 source stored as float64 on OpenCL, which waits for staging
    # sized by its 400 KiB of device bytes. Deciding "may this wait?" by the source's bytes held
    # the GIL there, and the two waited for each other (it hung within 300 rounds).
    opencl = [name for name in DEVICE_NAMES if name.startswith("opencl")]
    if not opencl:
        pytest.skip("no OpenCL device here: the staging wait this checks is OpenCL's")
    code = f"""
    import numpy as np
    import ferry, ferry._testing as testing
    testing.set_deferred_release(False)
    device = ferry.device("{opencl[0]}")
    small = np.ones(50_000, np.float32)
    for i in range(300):
        a = ferry.device_put(np.full((256, 1024), i, np.float32), device, semantics="async")
        b = ferry.device_put(small, device, device_dtype="float64")
        del a
    assert (ferry.device_get(b) == 1).all()
    print("completed")
    """
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "completed" in result.stdout
