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


def assert_exits_cleanly(code, attempts=3, quiet=False):
    """Runs `code` (which prints "main done" and returns while other threads still work)
    `attempts` times: each run must exit 0; `quiet`: and say nothing of leaks on stderr."""
    for attempt in range(attempts):
        result = run_python(textwrap.dedent(code), timeout=60)
        assert "main done" in result.stdout, result.stderr
        assert result.returncode == 0, (attempt, result.returncode, result.stderr[-2000:])
        if quiet:
            assert "leaked" not in result.stderr, (attempt, result.stderr[-2000:])
            assert "reference counting" not in result.stderr, (attempt, result.stderr[-2000:])


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


def test_a_read_into_out_in_flight_at_fork_is_refused_in_the_child():
    # The parent's engine threads, which would complete the read, are not in the child: its wait()
    # hung forever there.
    code = """
    import os
    import numpy as np
    import ferry
    x = np.ones(1 << 26)   # 512 MiB: the read is still going when the process forks
    a = ferry.device_put(x)
    read = a.copy_to_host_async(out=np.empty_like(x))
    pid = os.fork()
    if pid == 0:
        messages = []
        for attempt in (read.is_ready, read.wait):
            try:
                attempt()
                messages.append("no error")
            except ferry.FailedPreconditionError as error:
                messages.append("fork" in str(error))
        print("child", messages, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    read.wait()
    print("exit", os.waitstatus_to_exitcode(status))
    """
    result = run_with_prelude(code, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "child [True, True]" in result.stdout, result.stdout + result.stderr
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
    assert_exits_cleanly(code)


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
    assert_exits_cleanly(code, quiet=True)


def test_a_daemon_thread_inside_load_file_at_exit_is_clean(tmp_path):
    # Before: rc 134 ("terminate called without an active exception") in 8 of 8 runs: load_file
    # took the GIL back between windows to check for Ctrl-C, and CPython ended the daemon thread
    # there at exit (pthread_exit unwinding through the load). Only the main thread checks now.
    path = tmp_path / "m.safetensors"
    code = f"""
    import threading, time
    import numpy as np
    import ferry
    path = {str(path)!r}
    ferry.save_file({{f"t{{i}}": np.ones(1 << 17) for i in range(16)}}, path)
    ferry.set_setting("FERRY_LOAD_WINDOW_BYTES", 1 << 20)   # many windows, many checks
    started = threading.Event()
    def loop():
        while True:
            started.set()
            ferry.load_file(path, "host:0")
    for _ in range(2):
        threading.Thread(target=loop, daemon=True).start()
    started.wait()
    time.sleep(0.2)
    print("main done", flush=True)
    """
    assert_exits_cleanly(code)


def test_ferry_calls_made_while_the_interpreter_finalises_finish():
    # Before: a module global's __del__ (or a generator's finally) that called ferry at exit hung
    # the process for good: the main thread, which finalises, was parked like a daemon thread.
    # (A read into a new numpy array may fail that late: nanobind cannot import numpy once
    # Python has torn its imports down. It must raise, not hang.)
    code = """
    import numpy as np
    import ferry

    def flush(label, payload):
        a = ferry.device_put(payload, "host:0", semantics="async")
        a.block_until_ready()
        print(label, a.shape, ferry.metrics()["TransferToDeviceTime.count"] > 0, flush=True)
        try:
            print(label, "read", ferry.device_get(a).sum(), flush=True)
        except Exception as error:
            print(label, "read raised", type(error).__name__, flush=True)
        a.delete()

    class Checkpointer:
        def __init__(self, payload):
            self.flush, self.payload = flush, payload
        def __del__(self):
            self.flush("flushed", self.payload)

    def reader(payload):
        try:
            yield 1
        finally:
            flush("closed", payload)

    checkpointer = Checkpointer(np.ones(1 << 20))
    suspended = reader(np.full(4, 2.0))
    next(suspended)
    print("main done", flush=True)
    """
    result = run_python(textwrap.dedent(code), timeout=60)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    assert "main done" in result.stdout
    assert "flushed (1048576,) True" in result.stdout, result.stdout + result.stderr
    assert "closed (4,) True" in result.stdout, result.stdout + result.stderr


def test_the_main_thread_is_known_when_ferry_is_imported_from_another_thread():
    # Before: the main thread was threading.main_thread() at import, which (Python < 3.13) is the
    # thread that first imported threading: ferry imported from a _thread thread took that thread
    # for the main one, and the real main thread was parked at exit (a __del__ calling ferry hung).
    code = """
    import _thread, time
    import numpy as np
    box = {}
    def importer():
        import ferry
        box["ferry"] = ferry
    _thread.start_new_thread(importer, ())
    while "ferry" not in box:
        time.sleep(0.01)

    class Checkpointer:
        def __init__(self, ferry):
            self.ferry = ferry
        def __del__(self):
            a = self.ferry.device_put(np.ones(1 << 18), "host:0", semantics="async")
            a.block_until_ready()
            print("flushed", a.shape, flush=True)

    checkpointer = Checkpointer(box.pop("ferry"))
    print("main done", flush=True)
    """
    result = run_python(textwrap.dedent(code), timeout=60)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    assert "flushed (262144,)" in result.stdout, result.stdout + result.stderr


def test_exit_with_a_raw_thread_inside_ferry_is_quiet():
    # Before: a thread started with _thread.start_new_thread (which threading.enumerate() does not
    # list) made nanobind report 'leaked instances ... reference counting issue' at every exit.
    code = """
    import _thread, threading, time
    import numpy as np
    import ferry
    x = np.random.default_rng(0).random(1 << 20)
    started = threading.Event()
    def loop():
        device = ferry.device("host:0")
        while True:
            a = ferry.device_put(x, device)
            ferry.device_get(a)
            started.set()
    _thread.start_new_thread(loop, ())
    started.wait()
    time.sleep(0.2)
    print("main done", flush=True)
    """
    assert_exits_cleanly(code, quiet=True)


def test_no_leak_report_at_exit_when_jax_holds_the_main_module():
    # jaxlib's pytree registry keeps a registered type's module (here __main__, whose global holds
    # a ferry.Array) alive past finalisation; nanobind called that a reference counting bug.
    code = """
    import dataclasses
    import numpy as np
    import jax
    import ferry

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Params:
        w: jax.Array

    a = ferry.device_put(np.ones(3, np.float32), "host:0")
    print("ok", flush=True)
    """
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout
    assert "leaked" not in result.stderr, result.stderr[-2000:]
