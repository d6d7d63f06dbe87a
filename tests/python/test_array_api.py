"""The Array and package surface people know from JAX and numpy (issue 16): sizes, deletion,
early reads, pickling, numpy's copy protocol, sharded arrays that say so, every error code a
ferry.Error, the version, docstrings, the typing files, and aligned host memory for zero-copy."""

import collections
import os
import pathlib
import pickle
import re

import numpy as np
import pytest

import ferry
from conftest import run_python

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_projects():
    text = (REPO / "pyproject.toml").read_text()
    expected = re.search(r'^version = "([^"]+)"', text, re.M).group(1)
    assert ferry.__version__ == expected


def test_every_status_code_raises_a_ferry_error_subclass():
    seen = set()
    for code in range(1, 17):  # absl::StatusCode: 0 is OK, 1..16 are errors
        with pytest.raises(ferry.Error) as info:
            ferry._ferry._raise_status(code, f"code {code}")
        assert type(info.value) is not ferry.Error, f"code {code} maps to the base class"
        assert str(info.value) == f"code {code}"
        seen.add(type(info.value))
    assert len(seen) == 16, "each code has its own class"


def test_sizes_and_len(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = ferry.device_put(x, device, device_dtype="bfloat16")
    assert (a.ndim, a.size, a.nbytes, len(a)) == (3, 24, 24 * 4, 2)  # nbytes of float32, as numpy
    scalar = ferry.device_put(np.float64(2.5), device)
    assert (scalar.ndim, scalar.size, scalar.nbytes) == (0, 1, 8)
    with pytest.raises(TypeError):
        len(scalar)


def test_is_deleted_is_a_method_as_in_jax():
    a = ferry.device_put(np.ones(3))
    assert a.is_deleted() is False
    a.delete()
    assert a.is_deleted() is True
    assert repr(a) == "ferry.Array(<deleted>)"
    with pytest.raises(ferry.FailedPreconditionError):
        a.to_numpy()


def test_copy_to_host_async_then_to_numpy(device):
    x = np.random.default_rng(7).standard_normal((64, 33))
    a = ferry.device_put(x, device, semantics="async")
    a.copy_to_host_async()
    a.copy_to_host_async()  # a second call while the first is under way is a no-op
    np.testing.assert_array_equal(a.to_numpy(), x)
    np.testing.assert_array_equal(a.to_numpy(), x)  # later reads start again
    a.copy_to_host_async()
    np.testing.assert_array_equal(ferry.device_get([a])[0], x)


def test_copy_to_host_async_of_a_sharded_array():
    mesh = ferry.Mesh(ferry.devices("host")[:4], (2, 2), ("r", "c"))
    x = np.arange(7 * 6, dtype=np.int32).reshape(7, 6)
    a = ferry.device_put(x, ferry.Sharding(mesh, ("r", None)))  # replicated over "c"
    a.copy_to_host_async()
    np.testing.assert_array_equal(a.to_numpy(), x)


def test_copy_to_host_async_keeps_its_reads_alive_after_the_array_is_gone():
    a = ferry.device_put(np.arange(1 << 20, dtype=np.float32), semantics="async")
    a.copy_to_host_async()
    del a  # the reads hold their own host memory until they finish
    b = ferry.device_put(np.ones(5))
    np.testing.assert_array_equal(b.to_numpy(), np.ones(5))


def test_pickle_round_trip(device):
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    a = ferry.device_put(x, device, device_dtype="float64")
    b = pickle.loads(pickle.dumps(a))
    assert isinstance(b, ferry.Array)
    assert (b.device, b.device_dtype, b.dtype) == (a.device, "float64", np.float32)
    np.testing.assert_array_equal(b.to_numpy(), x)


def test_pickle_round_trip_of_a_sharded_array():
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    x = np.arange(10, dtype=np.int64)
    a = ferry.device_put(x, ferry.Sharding(mesh, ("x",)))
    b = pickle.loads(pickle.dumps(a))
    assert b.sharding.spec == ("x",)
    assert [d.name for d in b.sharding.mesh.devices] == ["host:0", "host:1"]
    np.testing.assert_array_equal(b.to_numpy(), x)


def test_numpy_copy_protocol():
    # numpy 2's rules (test_numpy_view.py has the rest): asarray views host memory read-only,
    # array copies, copy=False works where a view does and raises ValueError where it cannot.
    x = np.arange(6.0)
    a = ferry.device_put(x)
    np.testing.assert_array_equal(np.asarray(a), x)
    assert not np.asarray(a).flags.writeable and np.array(a).flags.writeable
    np.testing.assert_array_equal(np.array(a, dtype=np.float32), x.astype(np.float32))
    np.testing.assert_array_equal(np.array(a, copy=False), x)
    converted = ferry.device_put(x, device_dtype="float32")
    with pytest.raises(ValueError, match="copy"):
        np.array(converted, copy=False)


def test_a_sharded_array_says_it_is_sharded():
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    sharding = ferry.Sharding(mesh, ("x", None))
    a = ferry.device_put(np.zeros((4, 3)), sharding)
    assert a.device is sharding  # as JAX: a sharded array's device is its sharding
    assert "sharding=ferry.Sharding" in repr(a) and "host:1" in repr(a)
    assert a.shard_device_dtypes == ["float64", "float64"]
    shards = a.local_shards()
    assert [s.device_dtype for s in shards] == ["float64", "float64"]


def test_local_shards_of_an_unsharded_array_is_its_one_shard(device):
    x = np.arange(12).reshape(3, 4)
    a = ferry.device_put(x, device)
    (shard,) = a.local_shards()
    assert shard.device == a.device
    assert shard.index == (slice(0, 3), slice(0, 4))
    assert shard.device_dtype == a.device_dtype
    np.testing.assert_array_equal(shard.data, x)


def test_empty_is_aligned_and_zero_copy_aliases_it():
    x = ferry.empty((257, 3), "float32")
    assert x.ctypes.data % ferry.ALIGNMENT == 0 and x.flags.writeable
    assert x.shape == (257, 3) and x.dtype == np.float32
    x[...] = 1.5
    aliased = ferry.device_put(x, "host:0", semantics="zero_copy")
    assert aliased.is_alias
    # Off the alignment, zero_copy falls back to a copy, and the array says so.
    raw = ferry.empty(65, "uint8")
    misaligned = raw[1:].view(np.uint8)
    copied = ferry.device_put(misaligned, "host:0", semantics="zero_copy")
    assert not copied.is_alias
    np.testing.assert_array_equal(copied.to_numpy(), misaligned)


@pytest.mark.parametrize("shape", [-1, (2, -3), (-2, -2), (0, -1)])
def test_empty_refuses_negative_sizes_as_numpy_does(shape):
    # Before: ferry.empty(-1).shape was (0,), and (2, -3) gave (2, 2) or (2, 0) by alignment.
    with pytest.raises(ValueError, match="negative dimensions"):
        np.empty(shape)
    with pytest.raises(ValueError, match="negative dimensions"):
        ferry.empty(shape)
    assert ferry.empty((2, 0), "float64").shape == (2, 0)


def test_every_public_name_has_a_docstring():
    missing = [name for name in ferry.__all__ if not (getattr(ferry, name).__doc__ or "").strip()]
    assert not missing
    array_members = [
        "shape", "ndim", "size", "nbytes", "dtype", "device_dtype", "shard_device_dtypes", "device",
        "devices", "sharding", "is_alias", "is_deleted", "is_ready", "delete", "to_numpy",
        "block_until_ready", "copy_to_host_async", "local_shards", "__len__",
    ]
    undocumented = [m for m in array_members if not (getattr(ferry.Array, m).__doc__ or "").strip()]
    assert not undocumented


def test_the_package_ships_its_typing_files():
    package = pathlib.Path(ferry.__file__).parent
    assert (package / "py.typed").exists()
    stub = (package / "_ferry.pyi").read_text()
    for name in ("class Array", "def copy_to_host_async", "def to_numpy", "def nbytes"):
        assert name in stub


def test_python_dash_m_ferry_runs_the_command():
    program = pathlib.Path(ferry.__file__).parent / "bin" / "ferry"
    if not os.access(program, os.X_OK):
        pytest.skip(f"the package has no command-line program here ({program}): built without tools")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "ferry", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"ferry {ferry.__version__}"


def test_python_dash_m_ferry_runs_with_stdout_or_stderr_closed():
    # A closed stream is None in sys (python -m ferry ... >&-): the program still runs, as the
    # native one does, instead of a traceback from flushing None.
    program = pathlib.Path(ferry.__file__).parent / "bin" / "ferry"
    if not os.access(program, os.X_OK):
        pytest.skip(f"the package has no command-line program here ({program})")
    import subprocess
    import sys
    run = '"$0" -m ferry --version '
    stdout_closed = subprocess.run(["sh", "-c", run + ">&-", sys.executable], capture_output=True,
                                   text=True, timeout=60)
    assert (stdout_closed.returncode, stdout_closed.stderr) == (0, "")
    stderr_closed = subprocess.run(["sh", "-c", run + "2>&-", sys.executable],
                                   capture_output=True, text=True, timeout=60)
    assert stderr_closed.returncode == 0
    assert stderr_closed.stdout.strip() == f"ferry {ferry.__version__}"


# --- inputs people pass (issue 16, point 5) and sharding specs (point 7) ------------------------

class OnlyArrayInterface:
    """An object numpy can read only through __array_interface__ (no buffer, no DLPack)."""

    def __init__(self, data):
        self._data = data
        self.__array_interface__ = data.__array_interface__


class OnlyArray:
    def __init__(self, data):
        self._data = data

    def __array__(self, dtype=None, copy=None):
        return self._data


def test_objects_numpy_alone_can_read():
    x = np.arange(6, dtype=np.int16).reshape(2, 3)
    for wrapped in (OnlyArrayInterface(x), OnlyArray(x)):
        np.testing.assert_array_equal(ferry.device_put(wrapped).to_numpy(), x)


def test_python_scalars_are_0d_arrays():
    for value, dtype in ((1.5, np.float64), (3, np.int64), (True, np.bool_), (1 + 2j, np.complex128)):
        a = ferry.device_put(value)
        assert a.shape == () and a.dtype == dtype
        assert a.to_numpy() == value


def test_device_dtype_takes_torch_and_numpy_dtype_objects():
    torch = pytest.importorskip("torch", reason="torch is in the test extras")
    x = np.linspace(0, 1, 8, dtype=np.float32)
    assert ferry.device_put(x, device_dtype=torch.bfloat16).device_dtype == "bfloat16"
    assert ferry.device_put(x, device_dtype=torch.float64).device_dtype == "float64"
    assert ferry.device_put(x, device_dtype=np.float16).device_dtype == "float16"
    assert ferry.device_put(x, device_dtype=np.dtype("float64")).device_dtype == "float64"
    with pytest.raises(ferry.InvalidArgumentError, match="torch dtype"):
        ferry.device_put(x, device_dtype=torch.quint8)


def test_pytrees_round_trip_in_their_structure():
    tree = {"w": np.ones((2, 2), np.float32), "layers": [np.arange(3), (np.zeros(1), 2.5)]}
    placed = ferry.device_put(tree)
    assert isinstance(placed["w"], ferry.Array) and isinstance(placed["layers"][1], tuple)
    back = ferry.device_get(placed)
    assert set(back) == {"w", "layers"} and isinstance(back["layers"], list)
    np.testing.assert_array_equal(back["w"], tree["w"])
    np.testing.assert_array_equal(back["layers"][0], tree["layers"][0])
    assert back["layers"][1][1] == 2.5


def test_per_item_device_dtype_in_a_batch():
    x = np.linspace(-1, 1, 10)
    a, b, c = ferry.device_put([x, x, np.arange(4)], device_dtype=["float32", None, "int32"])
    assert (a.device_dtype, b.device_dtype, c.device_dtype) == ("float32", "float64", "int32")
    with pytest.raises(ferry.InvalidArgumentError, match="2 entries for 3 arrays"):
        ferry.device_put([x, x, x], device_dtype=["float32", None])


def test_per_leaf_device_dtypes_match_dicts_by_key_not_by_order():
    x = {"a": np.zeros(2), "b": np.zeros(3), "c": [np.zeros(1), np.zeros(4)]}
    placed = ferry.device_put(x, device_dtype={"c": "float32", "b": "float16", "a": "bfloat16"})
    assert placed["a"].device_dtype == "bfloat16"
    assert placed["b"].device_dtype == "float16"
    assert [leaf.device_dtype for leaf in placed["c"]] == ["float32", "float32"]  # a prefix
    with pytest.raises(ferry.InvalidArgumentError, match=r"missing \['a', 'c'\], unknown \['x'\]"):
        ferry.device_put(x, device_dtype={"x": "float16", "b": "float16"})
    with pytest.raises(ferry.InvalidArgumentError, match=r"at \['c'\] has 1 entry for 2"):
        ferry.device_put(x, device_dtype={"a": None, "b": None, "c": ["float32"]})
    with pytest.raises(ferry.InvalidArgumentError, match="for one array"):
        ferry.device_put(np.zeros(2), device_dtype=["float32"])


def test_errors_name_the_cause_and_the_batch_index():
    good = np.ones(3)
    with pytest.raises(ferry.InvalidArgumentError, match=r"item 1: numpy dtype <U3 has no ferry"):
        ferry.device_put([good, np.array(["abc"])])
    with pytest.raises(ferry.InvalidArgumentError, match="numpy dtype object"):
        ferry.device_put(np.array([object()]))
    with pytest.raises(ferry.InvalidArgumentError, match="item 2 is a str"):
        ferry.device_get([ferry.device_put(good), ferry.device_put(good), "x"])


def test_errors_name_sparse_and_meta_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is in the test extras")
    with pytest.raises(ferry.InvalidArgumentError, match=r"item 1: .*layout torch.sparse_coo"):
        ferry.device_put([np.ones(2), torch.eye(3).to_sparse()])
    with pytest.raises(ferry.InvalidArgumentError, match="meta torch tensor"):
        ferry.device_put(torch.empty(3, device="meta"))


def test_errors_name_nested_and_storageless_torch_tensors(tmp_path):
    # Before: "neither a buffer nor a CPU DLPack tensor" (a nested tensor of the strided layout)
    # and "data pointer lies outside its memory region" (no storage), from deep in the import.
    torch = pytest.importorskip("torch", reason="torch is in the test extras")
    from torch._subclasses.fake_tensor import FakeTensorMode

    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    for layout in (torch.strided, torch.jagged):
        nested = torch.nested.nested_tensor(parts, layout=layout)
        with pytest.raises(ferry.InvalidArgumentError, match=r"item 1: a nested torch tensor .*"
                                                             r"to_padded_tensor"):
            ferry.device_put([np.ones(2), nested])
    with FakeTensorMode():
        fake = torch.ones(3)
    for storageless in (torch._efficientzerotensor(3), fake):
        with pytest.raises(ferry.InvalidArgumentError, match="torch tensor with no storage"):
            ferry.device_put(storageless)
        with pytest.raises(ferry.InvalidArgumentError, match="torch tensor with no storage"):
            ferry.save_file({"w": storageless}, tmp_path / "w.safetensors")
    # An empty tensor's data pointer may be null too: it is put, as any empty array.
    assert ferry.device_put(torch._efficientzerotensor(0)).shape == (0,)
    assert ferry.device_put(torch.empty(0, 3)).shape == (0, 3)


def test_torch_parameters_that_require_grad_are_put_and_saved(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is in the test extras")
    # Every weight of a torch model: an nn.Parameter with requires_grad, which DLPack refuses to
    # export; ferry reads its memory (detached) as it reads any tensor's.
    layer = torch.nn.Linear(3, 2)
    expected = layer.weight.detach().numpy().copy()
    np.testing.assert_array_equal(ferry.device_put(layer.weight).to_numpy(), expected)
    tree = ferry.device_put(dict(layer.named_parameters()), device_dtype="bfloat16")
    assert sorted(tree) == ["bias", "weight"]
    np.testing.assert_array_equal(
        tree["weight"].to_numpy().astype(np.float32),
        torch.from_numpy(expected).to(torch.bfloat16).float().numpy())
    ferry.save_file({"w": layer.weight}, tmp_path / "w.safetensors")
    np.testing.assert_array_equal(ferry.load_file(tmp_path / "w.safetensors")["w"], expected)
    assert layer.weight.requires_grad  # the caller's parameter is left as it was
    with pytest.raises(ferry.InvalidArgumentError, match="meta torch tensor"):
        ferry.device_put(torch.nn.Parameter(torch.empty(3, device="meta")))


def test_pytrees_rebuild_defaultdicts_and_refuse_other_dict_subclasses_before_any_transfer():
    tree = collections.defaultdict(list, {"w": np.arange(3.0), "b": [np.ones(2)]})
    put = ferry.device_put(tree)
    assert type(put) is collections.defaultdict and put.default_factory is list
    np.testing.assert_array_equal(put["w"].to_numpy(), np.arange(3.0))
    back = ferry.device_get(put)
    assert type(back) is collections.defaultdict and back.default_factory is list
    np.testing.assert_array_equal(back["b"][0], np.ones(2))
    ordered = ferry.device_get(ferry.device_put(collections.OrderedDict(z=np.ones(1), a=np.ones(2))))
    assert type(ordered) is collections.OrderedDict and list(ordered) == ["z", "a"]
    before = ferry.metrics().get("TransferToDeviceTime.count", 0)
    with pytest.raises(ferry.InvalidArgumentError, match="collections.Counter in the input"):
        ferry.device_put(collections.Counter(a=1))
    with pytest.raises(ferry.InvalidArgumentError, match="pass dict"):
        ferry.device_put({"inner": collections.Counter(a=1), "w": np.ones(2)})
    assert ferry.metrics().get("TransferToDeviceTime.count", 0) == before, "a transfer ran"


def test_big_endian_bfloat16_is_put_by_value():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is a dependency of ferry")
    native = np.array([1, 2, -3.5, 0.15625], ml_dtypes.bfloat16)
    swapped = native.astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(">"))
    assert swapped.tobytes() != native.tobytes()
    got = ferry.device_put(swapped).to_numpy()
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), native.view(np.uint16))


def test_a_device_dtype_in_either_byte_order_names_the_same_dtype():
    # A device stores its own byte order: '>f4' asks for float32 as '<f4' does.
    x = np.arange(4, dtype=np.float64)
    for requested in (np.dtype(">f4"), ">f4", np.dtype("<f4")):
        a = ferry.device_put(x, device_dtype=requested)
        assert a.device_dtype == "float32", requested
        np.testing.assert_array_equal(a.to_numpy(), x)


def test_putting_a_deleted_ferry_array_says_it_is_deleted():
    a = ferry.device_put(np.ones(3))
    a.delete()
    with pytest.raises(ferry.FailedPreconditionError, match="has been deleted"):
        ferry.device_put(a)
    with pytest.raises(ferry.InvalidArgumentError, match=r"unknown dtype 'bf16' \(ferry's dtypes: "):
        ferry.device_put(np.ones(3), device_dtype="bf16")


def test_too_few_host_devices_say_how_to_get_more():
    # A fresh interpreter with the default single host device (this session has 8).
    result = run_python("""
import numpy as np, ferry
for attempt in (lambda: ferry.Mesh(ferry.devices("host")[:4], (2, 2), ("rows", "cols")),
                lambda: ferry.device_put(np.ones(2), "host:7")):
    try:
        attempt()
    except ferry.Error as error:
        print(type(error).__name__, "|", error)
""", timeout=120, env={"FERRY_HOST_DEVICES": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    mesh_error, device_error = result.stdout.strip().splitlines()
    assert mesh_error.startswith("InvalidArgumentError | mesh shape [2, 2] needs 4 devices, got 1")
    assert "FERRY_HOST_DEVICES" in mesh_error, mesh_error
    assert "host has 1 device(s); the host backend presents FERRY_HOST_DEVICES" in device_error, \
        device_error


def test_errors_name_a_deleted_jax_array():
    jax = pytest.importorskip("jax", reason="jax is in the test extras")
    x = jax.numpy.arange(4.0)
    x.delete()
    with pytest.raises(ferry.FailedPreconditionError, match="jax array has been deleted"):
        ferry.device_put(x)


def test_sharding_specs_are_checked_as_written():
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("rows",))
    # A bare string is one axis name for the first dimension.
    s = ferry.Sharding(mesh, "rows")
    assert s.spec == ("rows",)
    a = ferry.device_put(np.arange(8.0).reshape(4, 2), ferry.Sharding(mesh, ("rows", None)))
    np.testing.assert_array_equal(a.to_numpy(), np.arange(8.0).reshape(4, 2))
    with pytest.raises(ferry.InvalidArgumentError, match="not int 3"):
        ferry.Sharding(mesh, 3)
    with pytest.raises(ferry.InvalidArgumentError, match="entry 1 is 0"):
        ferry.Sharding(mesh, ("rows", 0))


def test_bool_follows_numpys_rule():
    # Before: bool() of any non-empty Array was True (Python's __len__ fallback).
    assert bool(ferry.device_put(np.array([0.0]))) is False
    assert bool(ferry.device_put(np.array(3))) is True
    for values in (np.zeros(2), np.ones((2, 2)), np.zeros(0)):
        with pytest.raises(ValueError, match="ambiguous"):
            bool(np.asarray(values))
        with pytest.raises(ValueError, match="ambiguous"):
            bool(ferry.device_put(values))


def test_float_int_complex_and_index_follow_numpys_rule(device):
    # Before: float(a), int(a), operator.index(a) raised TypeError for every Array (no
    # __float__/__int__/__complex__/__index__), unlike numpy's and JAX's arrays.
    import operator

    assert float(ferry.device_put(np.float32(2.5), device)) == 2.5
    assert float(ferry.device_put(np.array([[1.25]]), device, device_dtype="bfloat16")) == 1.25
    assert int(ferry.device_put(np.array([-2.75]), device)) == int(np.array([-2.75])[0]) == -2
    assert int(ferry.device_put(np.int64(2**62 + 1), device)) == 2**62 + 1
    assert complex(ferry.device_put(np.complex64(1 - 2j), device)) == 1 - 2j
    index = ferry.device_put(np.array(3, dtype=np.int16), device)
    assert operator.index(index) == 3
    assert list(range(10))[index] == 3
    for values in (np.zeros(2), np.zeros(0), np.ones((2, 1))):
        with pytest.raises(TypeError, match="one element"):
            float(ferry.device_put(values, device))
        with pytest.raises(TypeError, match="one element"):
            int(ferry.device_put(values, device))
    for not_an_index in (np.array(3.0), np.array(True), np.array([3])):
        with pytest.raises(TypeError):
            operator.index(np.asarray(not_an_index))
        with pytest.raises(TypeError, match="integer dtype is an index"):
            operator.index(ferry.device_put(not_an_index, device))
