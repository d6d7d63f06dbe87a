"""The seed's deadlock, and proof that each GIL defence alone prevents it.

An "async" put of a temporary that only the transfer holds, at once followed by a blocking read:
the transfer's completion drops the last reference to the Python object on a runtime thread while
the main thread waits for that transfer. Each scenario runs in a subprocess with a timeout, so a
hang fails the test instead of stalling CI.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import DEVICE_NAMES, run_python, skip_or_fail_unavailable

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


WATCHED = """
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)
import numpy as np
import ferry, ferry._testing as testing
testing.set_release_gil({defences})
testing.set_deferred_release({defences})
device = ferry.device("host:0")
{prelude}
# The watchdog's clock starts here: importing torch takes seconds on a loaded machine.
print("progress ready", file=sys.stderr, flush=True)
for i in range(2000):
    array = ferry.device_put({make_source}, device, semantics="async")
    out = ferry.device_get(array)
    print("progress", i, file=sys.stderr, flush=True)
print("completed", flush=True)
"""


def cpu_ticks(pid):
    """utime + stime of every thread of `pid`, in clock ticks."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def run_watched(source, defences, stall_seconds=3.0, limit_seconds=60.0):
    """Runs the scenario and watches its progress. Returns ("completed", stderr) or, when no
    iteration ends for `stall_seconds`, ("stuck", stderr with every Python thread's stack,
    CPU ticks used over one further second)."""
    code = WATCHED.format(defences=defences, make_source=SOURCES[source],
                          prelude="import torch" if source == "torch" else "")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    start = last_change = time.monotonic()
    seen = 0
    try:
        while process.poll() is None and time.monotonic() - start < limit_seconds:
            time.sleep(0.1)
            if not lines:  # still importing: the watch starts at "progress ready"
                last_change = time.monotonic()
            elif len(lines) != seen:
                seen, last_change = len(lines), time.monotonic()
            elif time.monotonic() - last_change > stall_seconds:
                before = cpu_ticks(process.pid)
                time.sleep(1.0)
                used = cpu_ticks(process.pid) - before
                process.send_signal(signal.SIGUSR1)  # faulthandler: every Python thread's stack
                time.sleep(1.0)
                process.kill()
                process.wait()
                reader.join(5)
                return "stuck", "".join(lines), used
        if process.poll() is None:
            process.kill()
            process.wait()
            return "too slow", "".join(lines), None
        reader.join(5)
        return ("completed" if process.returncode == 0 else "failed"), "".join(lines), None
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_without_either_defence_the_scenario_deadlocks(source):
    # Proves the tests above can fail: the workload finishes in seconds with the defences on; with
    # both off it stops making progress, every thread sleeps (no CPU used), and the main thread is
    # stuck inside ferry's blocking read while a runtime thread waits for the GIL it holds.
    outcome, _, _ = run_watched(source, defences=True, stall_seconds=60.0)  # slow is fine here
    assert outcome == "completed"
    outcome, stderr, cpu_used = run_watched(source, defences=False)
    assert outcome == "stuck", stderr[-3000:]
    assert cpu_used is not None and cpu_used <= 5, f"still running ({cpu_used} ticks): slow, not stuck"
    # faulthandler's dump: the main thread waits inside device_get's call into the extension.
    dump = stderr[stderr.find("Current thread") if "Current thread" in stderr else stderr.find("Thread 0x"):]
    assert "in device_get" in dump, stderr[-3000:]


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


def test_a_thread_that_sees_is_ready_finds_the_source_released_while_main_is_blocked():
    # Before: the source stayed alive after is_ready() said True for as long as the main thread
    # sat in join() (the queue's pending call runs only on the main thread, is_ready() did not
    # drain it): 0.5 s later it was still alive, 1 object queued.
    code = """
    import threading, weakref
    import numpy as np
    import ferry
    results = []
    def work():
        for i in range(20):
            x = np.full((1024, 1024, 4), i, dtype=np.float64)   # 32 MiB
            alive = weakref.ref(x)
            a = ferry.device_put(x, semantics="async")
            del x
            while not a.is_ready():
                pass
            results.append(alive() is None)
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    print(sum(results), len(results))
    """
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["20", "20"], result.stdout


def test_a_small_widening_copy_put_releases_the_gil_while_it_waits_for_staging():
    # Defence 1 alone (defence 2 off): an async put whose completion needs the GIL, then a
    # "copy" put of a 200 KiB float32 source stored as float64 on OpenCL, which waits for staging
    # sized by its 400 KiB of device bytes. Deciding "may this wait?" by the source's bytes held
    # the GIL there, and the two waited for each other (it hung within 300 rounds).
    opencl = [name for name in DEVICE_NAMES if name.startswith("opencl")]
    if not opencl:
        skip_or_fail_unavailable("no OpenCL device here: the staging wait this checks is OpenCL's")
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


SUBINTERPRETER = r"""
import threading, time
import numpy as np
import ferry
import _xxsubinterpreters as subinterpreters
subinterpreters.destroy(subinterpreters.create())  # CPython then turns PyGILState_Check off
main = threading.get_ident()
seen = []

class Source(np.ndarray):
    def __del__(self):
        seen.append(threading.get_ident() == main)

for i in range(4):
    x = np.ones(16 << 20, dtype=np.uint8).view(Source)
    a = ferry.device_put(x, "host:0", semantics="async")
    del x  # the transfer holds the last reference: dropped when its copy is done
    a.block_until_ready()
    for _ in range(100):
        if seen:
            break
        time.sleep(0.01)
    del a
print("on the main thread:", seen)
"""


def test_sources_are_released_under_the_gil_after_a_subinterpreter_existed():
    # Before: ferry asked PyGILState_Check, which answers yes on every thread once a
    # subinterpreter has existed, so a copy worker dropped the source without the GIL (an abort:
    # "PyThreadState_Get: the function must be called with the GIL held").
    pytest.importorskip("_xxsubinterpreters", reason="this Python has no subinterpreter module")
    result = run_python(SUBINTERPRETER, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "on the main thread: [True, True, True, True]" in result.stdout, result.stdout
