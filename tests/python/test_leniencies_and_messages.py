"""JAX's leniencies where they hide no mistake (None leaves in pytrees; short sharding specs are in
test_sharding.py), dtype errors that name the dtype whatever the framework, and a warning for a
setting set too late to take effect."""

import ml_dtypes
import numpy as np
import pytest

import ferry
from conftest import run_python


def test_none_leaves_pass_through_device_put_and_device_get(device):
    x = np.arange(6, dtype=np.float32)
    tree = ferry.device_put({"w": x, "bias": None, "layers": [None, (x, None)]}, device)
    assert tree["bias"] is None and tree["layers"][0] is None and tree["layers"][1][1] is None
    assert isinstance(tree["w"], ferry.Array) and tree["w"].device == device
    back = ferry.device_get(tree)
    assert back["bias"] is None and back["layers"][1][1] is None
    np.testing.assert_array_equal(back["layers"][1][0], x)
    assert ferry.device_put(None, device) is None
    assert ferry.device_get(None) is None
    assert ferry.device_get([None, {"a": None}]) == [None, {"a": None}]


def test_none_leaves_take_no_device_dtype(device):
    x = np.arange(4, dtype=np.float64)
    if "float32" not in device.dtypes:
        pytest.skip(f"{device.name} does not hold float32")
    tree = ferry.device_put([x, None], device, device_dtype=["float32", None])
    assert tree[0].device_dtype == "float32" and tree[1] is None


def test_int4_from_numpy_and_from_jax_names_the_dtype():
    with pytest.raises(ferry.InvalidArgumentError, match="numpy dtype int4 has no ferry dtype"):
        ferry.device_put(np.arange(8).astype(ml_dtypes.int4))
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    with pytest.raises(ferry.InvalidArgumentError, match="jax dtype int4 has no ferry dtype"):
        ferry.device_put(jnp.arange(8, dtype=jnp.int4))
    with pytest.raises(ferry.InvalidArgumentError, match=r"item 1: jax dtype uint4 has no ferry"):
        ferry.device_put([jnp.arange(2), jnp.arange(8, dtype=jnp.uint4)])
    # Dtypes ferry has still go through DLPack, bfloat16 included.
    y = ferry.device_put(jnp.arange(8, dtype=jnp.bfloat16))
    assert y.dtype == ml_dtypes.bfloat16


def test_torch_dtypes_ferry_lacks_are_named():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    with pytest.raises(ferry.InvalidArgumentError, match="torch dtype complex32 has no ferry dtype"):
        ferry.device_put(torch.zeros(4, dtype=torch.complex32))


def test_set_setting_warns_when_the_backend_has_read_it_already():
    code = """
    import warnings
    import ferry
    with warnings.catch_warnings(record=True) as early:
        warnings.simplefilter("always")
        ferry.set_setting("FERRY_HOST_DEVICES", 3)      # before the host backend starts: taken
        ferry.set_setting("FERRY_HOST_MEMORY_CACHE_BYTES", 1 << 20)  # applies at once
    print("early", len(early))
    print("devices", len(ferry.devices("host")))
    with warnings.catch_warnings(record=True) as late:
        warnings.simplefilter("always")
        ferry.set_setting("FERRY_HOST_DEVICES", 5)      # too late: the host backend read it
        ferry.set_setting("FERRY_HOST_MEMORY_LIMIT", None)
        ferry.set_setting("FERRY_HOST_MEMORY_CACHE_BYTES", 1 << 21)  # applies at once: no warning
    for w in late:
        print("late", w.category.__name__, w.filename.endswith("<string>"), w.message)
    print("devices", len(ferry.devices("host")))
    """
    result = run_python(code, timeout=60, env={"FERRY_HOST_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "early 0"
    assert lines[1] == "devices 3"
    late = [line for line in lines if line.startswith("late ")]
    assert len(late) == 2, lines
    assert late[0].startswith("late RuntimeWarning True set_setting('FERRY_HOST_DEVICES')")
    assert "host backend has started already" in late[0]
    assert "FERRY_HOST_MEMORY_LIMIT" in late[1]
    assert lines[-1] == "devices 3"


def test_every_setting_read_at_backend_start_is_known_to_set_setting():
    for name, row in ferry.settings().items():
        if row["scope"] == "client":
            assert name in ferry._settings._SETTINGS_READ_AT_BACKEND_START, name
    assert set(ferry._settings._SETTINGS_READ_AT_BACKEND_START) <= set(ferry.settings())


def test_arguments_of_the_wrong_type_are_named_and_objects_compare_by_value(tmp_path):
    # Each used to give nanobind's "incompatible function arguments" listing C++ signatures, an
    # AttributeError from inside ferry, or a float truncated / a str split into digits silently.
    import re
    d0 = ferry.devices("host")[0]
    mesh = ferry.Mesh([d0], (1,), ("a",))
    x = np.arange(12.0).reshape(3, 4)
    assert (d0 == None) is False and d0 != "host:0" and d0 in [None, d0]  # noqa: E711
    assert [None, "host:0"].count(d0) == 0 and d0 == ferry.device("host:0")
    wrong = [
        (lambda: ferry.device(None), "device()"), (lambda: ferry.device(0), "device()"),
        (lambda: ferry.devices(1), "devices()"), (lambda: ferry.global_devices(None), "global_devices()"),
        (lambda: ferry.set_setting(None, "1"), "set_setting"),
        (lambda: ferry.Mesh("host:0", (1,), ("a",)), "Mesh devices"),
        (lambda: ferry.Mesh([d0], (1.9,), ("a",)), "Mesh shape"),
        (lambda: ferry.Mesh([d0], "1", ("a",)), "Mesh shape"),
        (lambda: ferry.Mesh([d0], (True,), ("a",)), "Mesh shape"),
        (lambda: ferry.Mesh([d0], (1,), None), "Mesh axis_names"),
        (lambda: ferry.empty((2.5, 3)), "empty shape"), (lambda: ferry.empty("34"), "empty shape"),
        (lambda: ferry.make_array_from_shards((3, 4), None, [x]), "ferry.Sharding"),
        (lambda: ferry.make_array_from_callback((3, 4), "s", lambda i: x), "ferry.Sharding"),
        (lambda: ferry.make_array_from_shards((8.9,), ferry.Sharding(mesh, ()), [x]), "shape"),
        (lambda: ferry.shard_along("m", 0), "ferry.Mesh"),
        (lambda: ferry.shard_along(mesh, 0.5), "dim"),
        (lambda: ferry.shard_along(mesh, True), "dim"),
    ]
    for call, what in wrong:
        with pytest.raises(TypeError, match=re.escape(what)):
            call()
    assert ferry.Mesh([d0], (np.int64(1),), ("a",)).shape == (1,)  # numpy ints are ints
    # Meshes and shardings compare (and hash) by value, as JAX's do; a Sharding is read-only.
    again = ferry.Mesh([d0], (1,), ("a",))
    assert mesh == again and hash(mesh) == hash(again)
    first, second = ferry.Sharding(mesh, ("a",)), ferry.Sharding(again, ["a", None])
    assert first == second and {first: 1}[second] == 1
    assert ferry.Sharding(mesh, (None,)) != first
    with pytest.raises(AttributeError):
        first.spec = ("b",)
    # Shards and open files compare as objects (their arrays cannot answer ==).
    shard = ferry.device_put(x).local_shards()[0]
    assert shard == shard and isinstance(hash(shard), int)
    ferry.save_file({"x": x}, tmp_path / "x.safetensors")
    opened = ferry.open_file(tmp_path / "x.safetensors")
    assert opened == opened and opened != ferry.open_file(tmp_path / "x.safetensors")
