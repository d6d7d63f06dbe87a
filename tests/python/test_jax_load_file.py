"""ferry.jax.load_file: a checkpoint straight into jax.Arrays on ferry's platform (docs/jax.md).

One fresh JAX process (JAX reads its plugins once) registers ferry's plugin over the XLA CPU plugin
with 4 devices, writes checkpoints, loads them through ferry.jax.load_file in several ways and
prints one JSON object; each test checks its part against numpy's own conversion of the same data.
"""

import json

import pytest

from conftest import run_python, skip_or_fail_unavailable
from test_jax_plugin import PLUGIN, WRAPPED

pytest.importorskip("safetensors", reason="safetensors is not installed (pip install '.[test]')")

if PLUGIN is None or WRAPPED is None:
    skip_or_fail_unavailable("ferry's plugin or the XLA CPU plugin is missing")

PROGRAM = r"""
import json, os, sys, tempfile
import numpy as np, ml_dtypes
from safetensors.numpy import save_file
import ferry, ferry.jax
ferry.jax.register({wrapped!r}, priority=0, options={{"cpu_device_count": 4}})
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

rng = np.random.default_rng(7)
folder = tempfile.mkdtemp()
first = {{
    "w": (rng.standard_normal((8, 12)) * 3).astype(np.float32),
    "b": rng.standard_normal(12).astype(np.float32),
    "h": rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16),
    "d": rng.standard_normal((8, 4)).astype(np.float64),
    "ids": rng.integers(-1000, 1000, (8, 3), dtype=np.int64),
    "mask": rng.integers(0, 2, (5,)).astype(bool),
    "scalar": np.array(2.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}}
second = {{"v": rng.standard_normal((4, 8)).astype(np.float16)}}
save_file(first, os.path.join(folder, "a.safetensors"))
save_file(second, os.path.join(folder, "b.safetensors"))
a_path, b_path = (os.path.join(folder, n) for n in ("a.safetensors", "b.safetensors"))
devices = jax.devices("ferry")
out = {{"devices": len(devices)}}

def expect(value, dtype):
    return np.asarray(value).astype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))

def same(array, expected):
    got = np.asarray(array)
    return bool(got.dtype == expected.dtype and got.shape == expected.shape and
                np.array_equal(got.reshape(-1).view(np.uint8),
                                np.ascontiguousarray(expected).reshape(-1).view(np.uint8)))

before = ferry.jax.counters()
loaded = ferry.jax.load_file(a_path, dtype="bfloat16")
after = ferry.jax.counters()
out["order"] = list(loaded) == list(ferry.open_file(a_path))
out["types"] = {{n: str(a.dtype) for n, a in loaded.items()}}
out["on_ferry"] = all(a.devices() == {{devices[0]}} for a in loaded.values())
out["bf16_values"] = {{
    n: same(loaded[n], expect(first[n], "bfloat16" if first[n].dtype.kind == "f" else first[n].dtype))
    for n in first}}
# Every shard went to JAX without a second copy: the plugin aliased ferry's 64-byte-aligned memory
# (never ferry's own put path, which copies), and JAX computes on it.
# (An empty tensor has no memory to alias: the plugin leaves it to ferry's put path.)
nonempty = sum(1 for v in first.values() if v.size)
out["aliased"] = (after["puts_by_plugin"] - before["puts_by_plugin"] == nonempty and
                  after["puts_by_ferry"] - before["puts_by_ferry"] == len(first) - nonempty)
out["aligned"] = all(a.addressable_shards[0].data.unsafe_buffer_pointer() % 64 == 0
                     for a in loaded.values() if a.size)
out["compute"] = bool(np.array_equal(np.asarray(jax.jit(lambda x: x * 2)(loaded["w"])),
                                     expect(first["w"], "bfloat16") * 2))
donated = jax.jit(lambda x: x + 1, donate_argnums=0)(loaded["b"])
again = ferry.jax.load_file(a_path, names="b")["b"]
plus_one = (expect(first["b"], "bfloat16").astype(np.float32) + 1).astype(ml_dtypes.bfloat16)
out["donation"] = same(donated, plus_one)
out["donation_leaves_file"] = same(again, first["b"])

# No dtype: each tensor as stored (JAX's canonical types: int64 -> int32 without x64).
plain = ferry.jax.load_file([a_path, b_path], names=["w", "ids", "v"])
out["plain_values"] = {{n: same(plain[n], expect({{**first, **second}}[n], {{**first, **second}}[n].dtype))
                       for n in ("w", "ids", "v")}}
# A bytes path, as ferry.load_file takes it (before: iterated as a list of paths, ints).
out["bytes_path"] = {{n: same(a, first[n]) for n, a in
                     ferry.jax.load_file(os.fsencode(a_path), names=["w", "b"]).items()}}
out["two_files"] = list(plain) == [n for n in ferry.open_file(a_path) if n in ("w", "ids")] + ["v"]

# Sharded over 4 devices: rows, columns, and a rule that replicates what it cannot split.
mesh = Mesh(np.array(devices), ("x",))
rows = ferry.jax.load_file(a_path, NamedSharding(mesh, P("x")), "float16", names=["w", "d", "b"])
out["rows"] = {{n: same(rows[n], expect(first[n], "float16")) for n in rows}}
out["rows_sharding"] = {{n: list(rows[n].sharding.spec) for n in rows}}
out["rows_shard_shapes"] = [s.data.shape for s in rows["w"].addressable_shards]
cols = ferry.jax.load_file(a_path, NamedSharding(mesh, P(None, "x")), names=["w"])
out["cols"] = same(cols["w"], first["w"])
out["cols_shard_shapes"] = [s.data.shape for s in cols["w"].addressable_shards]
rule = lambda name, shape, dtype: NamedSharding(mesh, P("x") if shape and shape[0] % 4 == 0 else P())
ruled = ferry.jax.load_file(a_path, rule, pattern="*", exclude=["empty", "scalar"])
out["ruled"] = {{n: same(ruled[n], expect(first[n], first[n].dtype)) for n in ruled}}
out["ruled_spec"] = {{n: list(ruled[n].sharding.spec) for n in ruled}}

fp8_path = os.path.join(folder, "fp8.safetensors")
ferry.save_file({{"w": first["w"], "layers.0.scale": first["w"].astype(ml_dtypes.float8_e4m3fn)}},
                fp8_path)

def error(call):
    try:
        call()
    except Exception as e:
        return f"{{type(e).__name__}}: {{e}}"
    return "no error"

out["errors"] = {{
    "duplicate": error(lambda: ferry.jax.load_file([a_path, a_path])),
    "missing_name": error(lambda: ferry.jax.load_file(a_path, names="nope")),
    "missing_across": error(lambda: ferry.jax.load_file([a_path, b_path], pattern="nope*")),
    "bad_sharding": error(lambda: ferry.jax.load_file(a_path, sharding=3)),
    "dict_gap": error(lambda: ferry.jax.load_file(a_path, {{"w": NamedSharding(mesh, P())}})),
    "both": error(lambda: ferry.jax.load_file(a_path, NamedSharding(mesh, P()), device=devices[0])),
    "no_file": error(lambda: ferry.jax.load_file(os.path.join(folder, "none.safetensors"))),
    "bad_dtype": error(lambda: ferry.jax.load_file(a_path, dtype="bf16")),
    "fp8_to_bf16": error(lambda: ferry.jax.load_file(fp8_path, dtype="bfloat16", dtype_all=True)),
    "fp8_sharded": error(lambda: ferry.jax.load_file(fp8_path, NamedSharding(mesh, P("x")),
                                                     "bfloat16", dtype_all=True)),
}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def result():
    completed = run_python(PROGRAM.format(wrapped=WRAPPED), timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_loads_in_file_order_onto_ferrys_platform(result):
    assert result["devices"] == 4
    assert result["order"] and result["on_ferry"]


def test_dtype_applies_to_its_kind_and_jax_canonical_types(result):
    types = result["types"]
    assert types["w"] == types["b"] == types["h"] == types["d"] == types["scalar"] == "bfloat16"
    assert types["ids"] == "int32"  # JAX without x64: int64 stored as int32, in ferry's pass
    assert types["mask"] == "bool"
    assert all(result["bf16_values"].values()), result["bf16_values"]


def test_each_shard_is_taken_by_jax_without_another_copy(result):
    assert result["aliased"] and result["aligned"]
    assert result["compute"]
    assert result["donation"] and result["donation_leaves_file"]


def test_several_files_and_selection(result):
    assert result["two_files"]
    assert all(result["plain_values"].values()), result["plain_values"]
    assert result["bytes_path"] == {"w": True, "b": True}, result["bytes_path"]


def test_sharded_rows_columns_and_rules(result):
    assert all(result["rows"].values()), result["rows"]
    assert result["rows_sharding"]["w"] == ["x"]
    assert result["rows_sharding"]["b"] == ["x"]  # 12 rows split over 4
    assert result["rows_shard_shapes"] == [[2, 12]] * 4
    assert result["cols"] and result["cols_shard_shapes"] == [[8, 3]] * 4
    assert all(result["ruled"].values()), result["ruled"]
    assert result["ruled_spec"]["h"] == ["x"]
    assert result["ruled_spec"]["mask"] == []  # 5 rows: replicated by the rule


def test_bad_input_is_a_clear_error(result):
    errors = result["errors"]
    assert "more than one of the files" in errors["duplicate"]
    assert errors["missing_name"].startswith("NotFoundError") and "nope" in errors["missing_name"]
    assert errors["missing_across"].startswith("NotFoundError") and "'nope*'" in errors["missing_across"]
    assert "must be a jax.sharding.Sharding" in errors["bad_sharding"]
    assert "no entry for tensor" in errors["dict_gap"]
    assert "not both" in errors["both"]
    assert errors["no_file"].startswith("NotFoundError")
    # ferry's dtype names and error, as ferry.load_file's (was numpy's "data type not understood").
    assert errors["bad_dtype"].startswith("InvalidArgumentError: unknown dtype 'bf16'"), errors
    # A tensor that cannot be stored as asked is named by its file and name, not its position in
    # the put ("item 1"); each shard of a sharded one by its shard.
    assert errors["fp8_to_bf16"].startswith("UnimplementedError"), errors["fp8_to_bf16"]
    assert "fp8.safetensors:layers.0.scale'" in errors["fp8_to_bf16"], errors["fp8_to_bf16"]
    sharded = errors["fp8_sharded"]
    assert "fp8.safetensors:layers.0.scale[shard 0]'" in sharded, sharded


RAISING_RULE = r"""
import gc, os, threading, time
import numpy as np
import ferry, ferry.jax
path = os.path.join({folder!r}, "two.safetensors")
ferry.save_file({{"a": np.ones(4 << 20, np.float32), "b": np.ones(4 << 20, np.float32)}}, path)

def rule(name, shape, dtype):
    raise ValueError("no sharding for " + name)

for i in range(6):
    fd = os.open(path, os.O_RDONLY)  # cold pages: the look-ahead is still reading them
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    try:
        ferry.jax.load_file(path, sharding=rule)
    except ValueError:
        pass
    gc.collect()
    running = [t for t in threading.enumerate() if t.name == "ferry-load-prefetch"]
    assert not running, running
print("survived")
"""


def test_a_loop_body_that_raises_stops_the_look_ahead_before_the_file_goes(tmp_path):
    # Before: the next window's prefetch thread went on reading the file's pages after the
    # exception had dropped the last view and unmapped it (a segfault; Ctrl-C in a put too).
    result = run_python(RAISING_RULE.format(folder=str(tmp_path)), timeout=180,
                        env={"FERRY_LOAD_WINDOW_BYTES": str(16 << 20)})
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "survived" in result.stdout


def test_memory_kinds_complex_requests_and_replicated_jax_arrays_on_jaxs_cpu_devices(tmp_path):
    # On JAX's own CPU devices (no plugin): a sharding's memory kind is where the shards go (it was
    # dropped, or the load failed with "Memory kind mismatch"); dtype_all=complex64 turns real
    # tensors complex (refused before: ferry does not store real as complex); a fully replicated
    # jax.Array over several devices is put from one of its copies, a sharded one is refused
    # saying what to pass (it was "neither a buffer nor a CPU DLPack tensor").
    code = f"""
    import json
    import numpy as np
    import ferry, ferry.jax
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    path = {str(tmp_path / "m.safetensors")!r}
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    ferry.save_file({{"w": w, "b": np.arange(4, dtype=np.float32)}}, path)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
    out = {{}}
    for kind in ("pinned_host", "unpinned_host"):
        for spec in (P(), P("a", "b"), P("a", "b", None)):
            loaded = ferry.jax.load_file(path, NamedSharding(mesh, spec, memory_kind=kind))
            out[f"{{kind}} {{spec}}"] = [loaded["w"].sharding.memory_kind,
                                         bool(np.array_equal(np.asarray(loaded["w"]), w))]
    single = jax.sharding.SingleDeviceSharding(jax.devices()[1], memory_kind="unpinned_host")
    out["single"] = ferry.jax.load_file(path, single)["b"].sharding.memory_kind
    complex_ = ferry.jax.load_file(path, dtype="complex64", dtype_all=True)["w"]
    out["complex"] = [str(complex_.dtype), bool(np.array_equal(np.asarray(complex_), w + 0j))]
    pinned = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    out["complex_kind"] = ferry.jax.load_file(path, pinned, "complex64",
                                              dtype_all=True)["w"].sharding.memory_kind
    line = jax.devices()[:2]
    replicated = jax.device_put(w, NamedSharding(Mesh(np.array(line), ("x",)), P()))
    out["replicated"] = bool(np.array_equal(ferry.device_get(ferry.device_put(replicated)), w))
    split = jax.device_put(w, NamedSharding(Mesh(np.array(line), ("x",)), P("x")))
    try:
        ferry.device_put(split)
        out["split"] = "no error"
    except ferry.InvalidArgumentError as error:
        out["split"] = str(error)
    print(json.dumps(out))
    """
    completed = run_python(code, timeout=300,
                           env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert completed.returncode == 0, completed.stderr[-4000:]
    out = json.loads(completed.stdout.strip().splitlines()[-1])
    for kind in ("pinned_host", "unpinned_host"):
        for spec in ("P()", "P('a', 'b')", "P('a', 'b', None)"):
            assert out[f"{kind} {spec}"] == [kind, True], (kind, spec, out)
    assert out["single"] == "unpinned_host"
    assert out["complex"] == ["complex64", True]
    assert out["complex_kind"] == "pinned_host"   # JAX's cast put back where the sharding says
    assert out["replicated"] is True
    assert "sharded over 2 devices" in out["split"] and "addressable_shards" in out["split"]
