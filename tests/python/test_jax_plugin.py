"""JAX through ferry's PJRT plugin (ferry.jax, docs/jax.md) against the wrapped plugin alone.

Both plugins are registered in one fresh JAX process (JAX reads its plugins once, before its first
backend), and every case is run through both: the results must be bit-identical to each other
and to numpy. The subprocess prints one JSON object; each test below checks its part of it.
"""

import json
import os

import pytest

from conftest import run_python, skip_or_fail_unavailable

ferry_jax = pytest.importorskip("ferry.jax", reason="ferry's Python package is not importable")
pytest.importorskip("jax", reason="JAX is not installed (pip install '.[test]')")

try:
    PLUGIN = ferry_jax.plugin_path()
    PLUGIN_MISSING = ""
except Exception as error:  # noqa: BLE001 - ferry.UnavailableError, reported as the skip reason
    PLUGIN = None
    PLUGIN_MISSING = str(error)


def _plugin_file(package_name, file_name):
    """The plugin library `file_name` of the installed package `package_name`, or None."""
    try:
        package = __import__(package_name, fromlist=["__file__"])
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(package.__file__), file_name)
    return path if os.path.isfile(path) else None


# The XLA CPU plugin at API 0.81 (the version JAX 0.10.2 runs), or None.
WRAPPED = _plugin_file("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")
if PLUGIN is None:
    skip_or_fail_unavailable(f"no ferry_pjrt_plugin.so: {PLUGIN_MISSING}", allow_module_level=True)
if WRAPPED is None:
    skip_or_fail_unavailable("no XLA CPU plugin (pip install xla-cpu-pjrt)", allow_module_level=True)

# Runs in a fresh interpreter: registers "ferry" (ferry's plugin wrapping WRAPPED) and "wrapped"
# (WRAPPED alone), then runs every case through both.
PROGRAM = r"""
import json, sys
import numpy as np, ml_dtypes
import ferry.jax
ferry.jax.register({wrapped!r}, priority=0)
from jax._src import xla_bridge
xla_bridge.register_plugin("wrapped", library_path={wrapped!r}, priority=0)
import jax
jax.config.update("jax_enable_x64", True)

seed = {seed}
print("seed", seed, file=sys.stderr)
rng = np.random.default_rng(seed)
ferry_device = jax.devices("ferry")[0]
wrapped_device = jax.devices("wrapped")[0]
out = {{"devices": len(jax.devices("ferry")), "wrapped_devices": len(jax.devices("wrapped"))}}

def random_array(dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return (rng.standard_normal(shape) * 100).astype(dtype)

def views(array):
    return {{
        "dense": array,
        "transposed": array.transpose(2, 0, 1),
        "strided": array[::2, 1::2],
        "negative": array[::-1, :, ::-2],
        "broadcast": np.broadcast_to(array[:1, :1], (4,) + array.shape[1:]),
        "unaligned": np.frombuffer(np.ascontiguousarray(array).tobytes() + b"\0" * array.itemsize,
                                   dtype=array.dtype, offset=array.itemsize,
                                   count=array.size).reshape(array.shape)[1:],
        "empty": array[:0],
    }}

def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

dtypes = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64,
          np.complex128, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
puts = {{}}
for dtype in dtypes:
    array = random_array(dtype, (6, 10, 7))
    for name, view in views(array).items():
        through_ferry = jax.device_put(view, ferry_device)
        through_wrapped = jax.device_put(view, wrapped_device)
        a, b = np.asarray(through_ferry), np.asarray(through_wrapped)
        expected = np.ascontiguousarray(view)
        puts[f"{{np.dtype(dtype).name}}/{{name}}"] = [same(a, b), same(a, expected),
                                                 through_ferry.devices() == {{ferry_device}}]
out["puts"] = puts
out["counters_after_puts"] = ferry.jax.counters()

# A byte stride that is no multiple of the element size (a field of a packed record): ferry's
# kernels read it right whatever the wrapped plugin does with it.
record = np.zeros(33, dtype=[("tag", "u1"), ("value", "<f4")])
record["value"] = rng.standard_normal(33).astype(np.float32)
field = record["value"]
out["odd_stride"] = [field.strides[0], same(np.asarray(jax.device_put(field, ferry_device)),
                                            np.ascontiguousarray(field))]

source = random_array(np.float32, (64, 48))
@jax.jit
def step(x):
    return (x * 2.0 + 1.0) @ x.T + x.sum(axis=0)[:48]
jit_ferry = np.asarray(step(jax.device_put(source.T, ferry_device)))
jit_wrapped = np.asarray(step(jax.device_put(source.T, wrapped_device)))
out["jit"] = [same(jit_ferry, jit_wrapped), bool(np.isfinite(jit_ferry).all())]

# Large, dense and not 64-byte aligned (the plugin cannot alias it): ferry returns the put before
# writing it (a pending buffer it fulfils once written), computed on at once, and read at once.
def unaligned(values):
    raw = np.empty(values.size + 16, values.dtype)
    skip = next(k for k in range(1, 16) if (raw.ctypes.data + k * values.itemsize) % 64)
    view = raw[skip:skip + values.size].reshape(values.shape)
    view[...] = values
    return view
big = unaligned(random_array(np.float32, (768, 1024)))
after_the_call = ferry.jax.counters()["puts_after_the_call"]
big_step = jax.jit(lambda x: (x * 2.0 + 1.0) @ x.T)
big_ferry = np.asarray(big_step(jax.device_put(big, ferry_device)))
big_wrapped = np.asarray(big_step(jax.device_put(big, wrapped_device)))
halves = unaligned(np.ascontiguousarray(big[:, ::2]))
big_read = np.asarray(jax.device_put(halves, ferry_device))
out["big_jit"] = [same(big_ferry, big_wrapped), same(big_read, halves),
                  ferry.jax.counters()["puts_after_the_call"] - after_the_call]

# A strided source changed right after jax.device_put returns: the array holds the values at the
# call, as on the wrapped plugin, which copies a strided source during the call (before: ferry
# wrote it after the call, and about half of these puts showed the new values, some torn).
changed_later = []
before = ferry.jax.counters()["puts_after_the_call"]
for i in range(20):
    base = np.full((1024, 512), float(i), np.float32)
    for view in (base.T, base[::-1], base[::2, ::2]):
        x = jax.device_put(view, ferry_device)
        base[...] = -1.0
        changed_later.append(bool((np.asarray(x) != i).any()))
        base[...] = float(i)
out["strided_changed_later"] = [sum(changed_later), len(changed_later),
                                ferry.jax.counters()["puts_after_the_call"] - before]

donated = jax.device_put(source[:, ::2], ferry_device)
plus_one = jax.jit(lambda x: x + 1.0, donate_argnums=0)(donated)
out["donation"] = [same(np.asarray(plus_one), np.ascontiguousarray(source[:, ::2]) + 1.0),
                   donated.is_deleted()]

deleted = jax.device_put(source.T, ferry_device)
deleted.delete()
try:
    np.asarray(deleted)
    out["deletion"] = [deleted.is_deleted(), "no error"]
except Exception as error:
    out["deletion"] = [deleted.is_deleted(), type(error).__name__]

# The wrapped plugin's own error (a custom call it has no target for), through ferry's table.
try:
    jax.jit(lambda x: jax.ffi.ffi_call("ferry_no_such_target",
                                       jax.ShapeDtypeStruct(x.shape, x.dtype))(x))(
        jax.device_put(source, ferry_device)).block_until_ready()
    out["plugin_error"] = ["no error", ""]
except Exception as error:
    out["plugin_error"] = [type(error).__name__, str(error)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results():
    seed = int.from_bytes(os.urandom(4), "little")
    result = run_python(PROGRAM.format(wrapped=WRAPPED, seed=seed), timeout=240)
    assert result.returncode == 0, f"seed {seed}\n{result.stdout}\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_ferry_platform_has_the_wrapped_plugins_devices(results):
    assert results["devices"] == results["wrapped_devices"] > 0


def test_device_put_of_every_dtype_and_view_matches_the_wrapped_plugin_and_numpy(results):
    puts = results["puts"]
    assert len(puts) == 17 * 7
    wrong = {name: flags for name, flags in puts.items() if flags != [True, True, True]}
    assert not wrong, f"[same as wrapped, same as numpy, on ferry device]: {wrong}"


def test_ferry_writes_the_views_and_the_plugin_gets_only_what_it_aliases(results):
    # 17 dtypes x 7 views: the dense view may be 64-byte aligned (the plugin aliases it, zero
    # copies) or not (ferry copies it); every other view is ferry's, reads included.
    counters = results["counters_after_puts"]
    assert 17 * 6 <= counters["puts_by_ferry"] <= 17 * 7, counters
    assert counters["puts_by_ferry"] + counters["puts_by_plugin"] == 17 * 7, counters
    assert counters["refused"] == 0, counters


def test_odd_byte_strides_are_read_right(results):
    stride, correct = results["odd_stride"]
    assert stride == 5
    assert correct


def test_jit_on_ferry_arrays_matches_the_wrapped_plugin(results):
    assert results["jit"] == [True, True]


def test_large_puts_return_before_they_are_written_and_compute_and_read_right(results):
    same_jit, same_read, after_the_call = results["big_jit"]
    assert same_jit and same_read
    assert after_the_call == 2, results["big_jit"]


def test_a_strided_source_changed_after_the_put_returns_does_not_show(results):
    changed, puts, after_the_call = results["strided_changed_later"]
    assert puts == 60
    assert changed == 0, results["strided_changed_later"]
    assert after_the_call == 0, results["strided_changed_later"]


def test_donated_ferry_buffer_is_consumed_and_the_result_right(results):
    assert results["donation"] == [True, True]


def test_deleted_array_cannot_be_read(results):
    is_deleted, error = results["deletion"]
    assert is_deleted
    assert error == "RuntimeError"


def test_wrapped_plugin_error_surfaces_as_jax_error_with_its_message(results):
    kind, message = results["plugin_error"]
    assert kind == "JaxRuntimeError", message
    assert "ferry_no_such_target" in message


def test_unloadable_wrapped_plugin_is_a_jax_error_naming_it(tmp_path):
    missing = tmp_path / "no_such_plugin.so"
    program = f"""
import ferry.jax, jax
ferry.jax.register({str(missing)!r}, priority=0)
try:
    jax.devices("ferry")
    print("no error")
except Exception as error:
    print(type(error).__name__, "|", error)
"""
    result = run_python(program, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert str(missing) in result.stdout, result.stdout + result.stderr[-3000:]
    assert "no error" not in result.stdout


DEADLOCK = r"""
import sys, numpy as np
import ferry.jax
ferry.jax.register({wrapped!r}, priority=0)
import jax
device = jax.devices("ferry")[0]

def aligned_full(shape, value):
    # numpy's large arrays are 16-byte aligned; the plugin aliases only 64-byte aligned ones.
    count = int(np.prod(shape))
    memory = np.empty(count + 16, dtype=np.float32)
    start = (-memory.ctypes.data % 64) // 4
    array = memory[start:start + count].reshape(shape)
    array.fill(value)
    return array

for i in range({repeats}):
    # Temporaries only the transfer holds (the seed's scenario, test_gil.py), through JAX: a
    # strided one (ferry's copy) and a dense aligned one (aliased by the wrapped plugin until the
    # buffer dies, when its done_with_host_buffer releases the numpy array), each read back at once.
    strided = jax.device_put(np.full((256, 2048), i, dtype=np.float32)[:, ::2], device)
    dense = jax.device_put(aligned_full((256, 1024), i), device)
    for array in (strided, dense):
        out = np.asarray(array)
        if out[0, 0] != i or out[-1, -1] != i:
            sys.exit(f"wrong data at repeat {{i}}")
    del strided, dense
counters = ferry.jax.counters()
print("completed", {repeats}, counters["puts_by_ferry"], counters["puts_by_plugin"])
"""


def test_async_put_then_blocking_read_through_jax_never_hangs():
    result = run_python(DEADLOCK.format(wrapped=WRAPPED, repeats=40), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # Both paths ran every time: ferry's copy and the plugin's alias.
    assert "completed 40 40 40" in result.stdout, result.stdout


FORK = r"""
import os, sys, time, numpy as np
import ferry.jax
ferry.jax.register({wrapped!r}, priority=0)
import jax
device = jax.devices("ferry")[0]
source = np.arange(512 * 600, dtype=np.float32).reshape(512, 600)

def put_and_check(tag):
    # 1.2 MB through a transpose: ferry's copy on its workers, after the call returns.
    array = jax.device_put(source.T, device)
    if not np.array_equal(np.asarray(array), source.T):
        sys.exit(f"{{tag}}: wrong data")

put_and_check("parent before the fork")  # the parent's workers have run
pid = os.fork()
if pid == 0:
    put_and_check("child")
    put_and_check("child again")
    os._exit(0)
for _ in range(300):  # up to 30 s
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    print("child hung")
put_and_check("parent after the fork")
print("parent ok")
"""


def test_forked_child_transfers_through_ferrys_plugin_with_workers_of_its_own():
    # Before: the copy workers were the parent's, absent in a forked child, whose first put of
    # more than 256 KiB then waited forever for a buffer they would fulfil.
    result = run_python(FORK.format(wrapped=WRAPPED), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child exit 0" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "parent ok" in result.stdout, result.stdout + result.stderr[-3000:]


def test_benchmark_prints_a_row_per_case_and_direction_at_a_tiny_size():
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "jax_plugin_bench.py")
    result = run_python(
        f"import runpy, sys; sys.argv = ['bench', '--size', '64', '--repeats', '1', "
        f"'--wrapped', {WRAPPED!r}]; runpy.run_path({bench!r}, run_name='__main__')",
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    cases = {(row["case"], row["direction"]) for row in report["rows"]}
    assert cases == {(case, op) for case in ("dense", "dense_aligned", "transposed", "strided",
                                                  "bf16_from_f32")
                     for op in ("put", "get")}
    assert all(row["ferry_ms"] > 0 and row["wrapped_ms"] > 0 for row in report["rows"])


def _entry_point_installed():
    from importlib.metadata import entry_points

    return any(entry.value == "ferry.jax" for entry in entry_points(group="jax_plugins"))


@pytest.mark.skipif(not _entry_point_installed(),
                    reason="ferry is not pip-installed here (entry points come from its metadata)")
def test_jax_plugins_entry_point_registers_ferry_when_asked():
    program = """
import numpy as np, jax, ferry.jax
device = jax.devices("ferry")[0]
out = np.asarray(jax.device_put(np.arange(12.0).reshape(3, 4).T, device))
counters = ferry.jax.counters()
print(out.tolist() == np.arange(12.0).reshape(3, 4).T.tolist(),
      counters["puts_by_ferry"] + counters["puts_by_plugin"])
"""
    result = run_python(program, timeout=120,
                        env={"FERRY_JAX_PLUGIN": "1", "FERRY_PJRT_WRAPPED_PLUGIN": WRAPPED})
    assert result.returncode == 0, result.stderr[-3000:]
    # The put went through ferry's plugin entry. Which path it took inside depends on where JAX's
    # contiguous copy of the transposed source landed: 64-byte aligned (1 run in 12 here), the
    # wrapped plugin aliases it (puts_by_plugin); else ferry writes it (puts_by_ferry). CI saw both.
    assert result.stdout.split() == ["True", "1"], result.stdout


def test_one_ferry_per_process_with_jax_on_ferrys_plugin():
    """`import ferry` and JAX on ferry's plugin share one ferry runtime: one libferry.so mapped,
    no copy of ferry inside the plugin or the extension, and ferry.metrics() counts the plugin's
    transfers (a second, private copy of ferry in the plugin would keep its own registry)."""
    program = """
import json, numpy as np, ferry, ferry.jax
ferry.jax.register()
import jax
before = ferry.metrics()
device = jax.devices("ferry")[0]
x = np.arange(4096.0, dtype=np.float32).reshape(64, 64)
y = jax.device_put(x[::2, ::3], device)
back = np.asarray(y)
after = ferry.metrics()
names = ("PjrtPluginPutsByFerry", "PjrtPluginPutsByPlugin", "PjrtPluginReadsByFerry",
         "PjrtPluginReadsByPlugin")
deltas = {name: after.get(name, 0) - before.get(name, 0) for name in names}
counters = ferry.jax.counters()
with open("/proc/self/maps") as maps:
    runtimes = sorted({line.split()[-1] for line in maps if line.rstrip().endswith("/libferry.so")})
print(json.dumps({"deltas": deltas, "counters": counters, "runtimes": runtimes,
                  "equal": back.tolist() == x[::2, ::3].tolist()}))
"""
    result = run_python(program, timeout=120, env={"FERRY_PJRT_WRAPPED_PLUGIN": WRAPPED})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["equal"]
    # One libferry.so, beside the package: the extension's and the plugin's.
    package_dir = os.path.dirname(os.path.abspath(ferry_jax.__file__))
    assert report["runtimes"] == [os.path.join(package_dir, "libferry.so")], report["runtimes"]
    deltas, counters = report["deltas"], report["counters"]
    # ferry.metrics() saw the plugin's put, and counted every path as ferry.jax.counters() did
    # (JAX reads a CPU array through its own zero-copy view, so reads may be none here).
    assert deltas["PjrtPluginPutsByFerry"] + deltas["PjrtPluginPutsByPlugin"] >= 1, deltas
    for name, counter in (("PjrtPluginPutsByFerry", "puts_by_ferry"),
                          ("PjrtPluginPutsByPlugin", "puts_by_plugin"),
                          ("PjrtPluginReadsByFerry", "reads_by_ferry"),
                          ("PjrtPluginReadsByPlugin", "reads_by_plugin")):
        assert deltas[name] == counters[counter], (deltas, counters)


@pytest.mark.parametrize("api", ["0.81", "0.115"])
def test_jax_computes_on_ferrys_plugin_over_either_plugin_version(api):
    """JAX's Execute passes through ferry's version bridge (src/plugin/version_bridge.h) to the
    wrapped plugin whatever its version: on 0.81 (the header JAX and ferry share: nothing to
    extend) and on 0.115 (newer than ferry's header: the options are given zeros up to
    kExtendedOptionsBytes), jit, matmul and reads agree with numpy."""
    # 0.115: the same XLA CPU plugin built at that API (lammps-jax-pjrt-cpu).
    wrapped = (WRAPPED if api == "0.81"
               else _plugin_file("lammps_jax_pjrt_cpu", "pjrt_c_api_cpu_plugin.so"))
    if wrapped is None:
        skip_or_fail_unavailable(f"no XLA CPU plugin at PJRT API {api}")
    program = """
import json, numpy as np, ferry, ferry.jax
ferry.jax.register()
import jax, jax.numpy as jnp
device = jax.devices("ferry")[0]
a = np.arange(48, dtype=np.float32).reshape(6, 8) / 7
b = np.linspace(-1, 1, 40, dtype=np.float32).reshape(8, 5)
x, y = jax.device_put(a, device), jax.device_put(b, device)
before = ferry.metrics().get("PjrtPluginBridgedExecuteOptions", 0)
z = jax.jit(lambda p, q: jnp.tanh(p @ q) + 1)(x, y)
got = np.asarray(z)
bridged = ferry.metrics().get("PjrtPluginBridgedExecuteOptions", 0) - before
print(json.dumps({"close": bool(np.allclose(got, np.tanh(a @ b) + 1, rtol=1e-5, atol=1e-6)),
                  "platform": str(z.devices()), "bridged": bridged}))
"""
    result = run_python(program, timeout=180, env={"FERRY_PJRT_WRAPPED_PLUGIN": wrapped})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["close"], report
    if api == "0.81":
        assert report["bridged"] == 0, report  # JAX's options are the plugin's own size
    else:
        assert report["bridged"] >= 1, report  # extended for the newer plugin


CLIENT_GONE = r"""
import gc, numpy as np
import ferry.jax
ferry.jax.register({wrapped!r}, priority=0)
import jax
from jax._src import xla_bridge
source = np.ones((8192, 8192), np.float32)
for i in range(3):
    # 256 MiB through a transpose: ferry writes it after the call; the array (its buffer) and then
    # the client are destroyed at once, which PJRT allows while the put is still being written.
    a = jax.device_put(source.T, jax.devices("ferry")[0])
    del a
    jax.clear_caches()
    xla_bridge._clear_backends()
    gc.collect()
print("survived")
"""


def test_a_client_destroyed_with_puts_in_flight_waits_for_them():
    # Before: ferry's fulfilment thread called CreateViewOfDeviceBuffer on the destroyed client (a
    # segfault on the second round, every run); ferry's PJRT_Client_Destroy now waits for it.
    result = run_python(CLIENT_GONE.format(wrapped=WRAPPED), timeout=180,
                        env={"JAX_PLATFORMS": "ferry"})
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "survived" in result.stdout


def test_a_process_that_never_imports_ferry_finds_the_plugin_installed_beside_it():
    # torch_xla's PJRT_DEVICE=LIBRARY, or JAX's register_plugin alone, load ferry's plugin with no
    # `import ferry` to say where the packages are. Before: with no FERRY_PJRT_SEARCH_PATH,
    # PYTHONPATH or VIRTUAL_ENV, a pip install's plugin searched nowhere ("no PJRT plugin ...
    # searched: ") though the XLA CPU plugin sat in the same site-packages.
    import subprocess
    import sys

    program = f"""
import numpy as np
from jax._src import xla_bridge
xla_bridge.register_plugin("ferry", library_path={PLUGIN!r}, priority=500)
import jax
x = jax.device_put(np.arange(12.0, dtype=np.float32).reshape(3, 4).T, jax.devices("ferry")[0])
print("sum", float(np.asarray(x).sum()))
"""
    unset = ("FERRY_PJRT_SEARCH_PATH", "FERRY_PJRT_WRAPPED_PLUGIN", "FERRY_PJRT_PLUGIN",
             "PYTHONPATH", "VIRTUAL_ENV", "FERRY_JAX_PLUGIN")
    env = {name: value for name, value in os.environ.items() if name not in unset}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sum 66.0" in result.stdout, result.stdout + result.stderr[-2000:]
