"""ferry across a process's life: fork() after use, and interpreter exit during a blocking call.

Each scenario runs in a subprocess with a timeout, so that a hang fails the test instead of
stalling CI.
"""

import textwrap

import pytest

from conftest import DEVICE_NAMES, run_python

# A put of 16 MiB and a read back: both run on the host engine's threads, not inline.
PRELUDE = """
import os
import numpy as np
import ferry

def round_trip(seed):
    x = np.random.default_rng(seed).random(1 << 21)   # 16 MiB of float64
    a = ferry.device_put(x, "host:0", device_dtype="float32")
    back = ferry.device_get(a)
    assert np.array_equal(back, x.astype(np.float32).astype(np.float64)), "wrong data"
    return a
"""


def run_with_prelude(code, timeout):
    return run_python(PRELUDE + textwrap.dedent(code), timeout=timeout)


def test_a_forked_child_rebuilds_the_host_client_and_transfers():
    code = """
    import os, sys
    import numpy as np
    import ferry
    parent_array = round_trip(1)   # the host engine's threads exist in the parent only
    pid = os.fork()
    if pid == 0:
        try:
            round_trip(2)
            ferry.device_put(np.ones((64, 1024)), semantics="async").block_until_ready()
            print("child ok", flush=True)
            os._exit(0)
        except BaseException as error:
            print("child failed:", repr(error), flush=True)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    round_trip(3)   # the parent still works
    print("parent ok", os.waitstatus_to_exitcode(status))
    """
    result = run_with_prelude(code, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child ok" in result.stdout, result.stdout + result.stderr
    assert "parent ok 0" in result.stdout


def test_a_forked_child_refuses_what_the_parent_made_at_once():
    code = """
    import os
    import numpy as np
    import ferry
    a = round_trip(1)
    device = ferry.device("host:0")
    pid = os.fork()
    if pid == 0:
        messages = []
        for attempt in (lambda: ferry.device_get(a), lambda: a.block_until_ready(),
                        lambda: ferry.device_put(np.ones(1 << 20), device),
                        lambda: device.memory_stats(), lambda: device.bytes_in_use):
            try:
                attempt()
                messages.append("no error")
            except ferry.FailedPreconditionError as error:
                messages.append("fork" in str(error))
        del a   # dropped without waiting for the parent's engine
        print("child", messages, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("exit", os.waitstatus_to_exitcode(status))
    """
    result = run_with_prelude(code, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # The parent's device counts the parent's arrays: its memory statistics are refused too.
    assert "child [True, True, True, True, True]" in result.stdout, result.stdout + result.stderr
    assert "exit 0" in result.stdout


def test_multiprocessing_fork_workers_put_and_get():
    code = """
    import multiprocessing as mp
    import numpy as np
    import ferry
    def work(seed):
        round_trip(seed)
        return seed
    if __name__ == "__main__":
        round_trip(0)
        with mp.get_context("fork").Pool(2) as pool:
            print("done", sorted(pool.map(work, range(1, 5))))
    """
    result = run_with_prelude(code, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done [1, 2, 3, 4]" in result.stdout


@pytest.mark.parametrize("call", ["device_get", "copy_put", "block_until_ready"])
def test_exit_while_a_daemon_thread_is_inside_a_blocking_call_is_clean(call):
    # The daemon thread loops on a blocking call (GIL released inside); the main thread returns
    # from the script while it is inside one: the thread must not take the process down with it.
    code = f"""
    import threading, time
    import numpy as np
    import ferry
    x = np.random.default_rng(0).random(1 << 23)   # 64 MiB: each call takes a few ms
    a = ferry.device_put(x, device_dtype="float32")
    started = threading.Event()
    def loop():
        while True:
            started.set()
            if "{call}" == "device_get":
                ferry.device_get(a)
            elif "{call}" == "copy_put":
                ferry.device_put(x, device_dtype="float16")
            else:
                ferry.device_put(x, device_dtype="bfloat16", semantics="async").block_until_ready()
    for _ in range(4):
        threading.Thread(target=loop, daemon=True).start()
    started.wait()
    time.sleep(0.3)
    print("main done", flush=True)
    """
    for attempt in range(3):
        result = run_python(code, timeout=60)
        assert "main done" in result.stdout, result.stderr
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-2000:])


@pytest.mark.parametrize("device_name", DEVICE_NAMES)
def test_exit_while_daemon_threads_put_and_read_is_quiet(device_name):
    # Daemon threads put and read back in a loop, each holding its device and its latest array,
    # when the main thread returns: the interpreter freezes them where they are, so those objects
    # are never freed, and the exit must not call that a reference counting bug on stderr.
    code = f"""
    import threading, time
    import numpy as np
    import ferry
    device = ferry.device("{device_name}")
    started = threading.Event()
    def loop(seed):
        x = np.random.default_rng(seed).standard_normal((256, 257))
        while True:
            a = ferry.device_put(x[:, ::2], device)
            np.asarray(a)
            started.set()
    for seed in range(4):
        threading.Thread(target=loop, args=(seed,), daemon=True).start()
    started.wait()
    time.sleep(0.2)
    print("main done", flush=True)
    """
    for attempt in range(3):
        result = run_python(code, timeout=60)
        assert "main done" in result.stdout, result.stderr
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-2000:])
        assert "leaked" not in result.stderr, (attempt, result.stderr[-2000:])
        assert "reference counting" not in result.stderr, (attempt, result.stderr[-2000:])
