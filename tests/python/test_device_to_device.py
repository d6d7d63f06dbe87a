"""Device to device: device_put of a ferry.Array onto another device (Buffer::CopyToDevice: the
plugin's own copy on pjrt), and ferry.from_dlpack of ferry arrays and of host DLPack producers."""

import numpy as np
import pytest

import ferry
from conftest import DEVICE_NAMES

SEED = 28007


@pytest.mark.parametrize("target_name", DEVICE_NAMES)
def test_device_put_of_an_array_copies_it_device_to_device(device, target_name):
    target = ferry.device(target_name)
    x = np.random.default_rng(SEED).standard_normal((5, 9)).astype(np.float32)
    a = ferry.device_put(x, device)
    before = ferry.metrics()
    b = ferry.device_put(a, target)
    after = ferry.metrics()
    assert b.device == target and b.shape == a.shape and b.dtype == np.float32
    assert b.device_dtype == "float32"
    # Device to device: no put from the host (a host source would count OutboundData).
    assert after["OutboundData.count"] == before["OutboundData.count"]
    a.delete()  # the copy is independent of the original
    np.testing.assert_array_equal(ferry.device_get(b), x)


def test_device_put_of_an_array_keeps_its_logical_and_device_dtypes(device):
    if "float32" not in device.dtypes:
        pytest.skip(f"{device.name} does not hold float32")
    x = np.random.default_rng(SEED).standard_normal(17)
    a = ferry.device_put(x, "host:1", device_dtype="float32")
    b = ferry.device_put(a, device)
    assert b.dtype == np.float64 and b.device_dtype == "float32" and b.device == device
    np.testing.assert_array_equal(ferry.device_get(b), x.astype(np.float32).astype(np.float64))


def test_device_put_of_an_array_goes_through_the_host_where_it_must():
    x = np.random.default_rng(SEED).standard_normal((4, 8))
    a = ferry.device_put(x, "host:0")
    # Another device dtype: read back in the logical dtype and put again, converted.
    b = ferry.device_put(a, "host:1", device_dtype="bfloat16")
    assert b.device_dtype == "bfloat16" and b.dtype == np.float64
    # A sharding: the whole array, then its shards.
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    c = ferry.device_put(a, ferry.Sharding(mesh, ("x",)))
    np.testing.assert_array_equal(ferry.device_get(c), x)
    # A sharded array onto one device: assembled through the host.
    d = ferry.device_put(c, "host:3")
    assert d.device == ferry.device("host:3")
    np.testing.assert_array_equal(ferry.device_get(d), x)


def test_device_put_of_a_pytree_mixes_copies_and_puts(device):
    rng = np.random.default_rng(SEED)
    w, b = rng.standard_normal((3, 3)).astype(np.float32), rng.integers(0, 5, 4)
    on_device = ferry.device_put(w, device)
    tree = ferry.device_put({"w": on_device, "b": b, "none": None}, "host:2")
    assert tree["none"] is None
    assert tree["w"].device == ferry.device("host:2") and tree["b"].device == ferry.device("host:2")
    np.testing.assert_array_equal(tree["w"].to_numpy(), w)
    np.testing.assert_array_equal(tree["b"].to_numpy(), b)


def test_device_put_of_a_deleted_array_names_it(device):
    a = ferry.device_put(np.ones(2, np.float32), device)
    a.delete()
    with pytest.raises(ferry.FailedPreconditionError,
                       match="item 1: a ferry.Array that has been deleted"):
        ferry.device_put([np.ones(2), a], "host:1")


def test_from_dlpack_of_an_array_shares_it_or_copies_it(device):
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    a = ferry.device_put(x, device)
    same = ferry.from_dlpack(a)
    assert same is not a and same.device == device
    a.delete()  # each Array drops only its own reference
    np.testing.assert_array_equal(same.to_numpy(), x)
    elsewhere = ferry.from_dlpack(same, "host:4")
    assert elsewhere.device == ferry.device("host:4")
    np.testing.assert_array_equal(elsewhere.to_numpy(), x)


def test_from_dlpack_of_a_sharded_array_keeps_its_sharding():
    mesh = ferry.Mesh(ferry.devices("host")[:2], (2,), ("x",))
    sharding = ferry.Sharding(mesh, ("x",))
    a = ferry.device_put(np.arange(8.0), sharding)
    b = ferry.from_dlpack(a)
    assert b.sharding is sharding
    np.testing.assert_array_equal(b.to_numpy(), np.arange(8.0))


def test_from_dlpack_of_host_producers_aliases_them():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.arange(64, dtype=torch.float32)
    a = ferry.from_dlpack(ferry.empty(64, "float32"))  # numpy, 64-byte aligned
    assert a.is_alias
    b = ferry.from_dlpack(t)
    np.testing.assert_array_equal(b.to_numpy(), t.numpy())


class _DeviceMemoryProducer:
    """A DLPack producer that says its memory is a GPU's (as a CUDA torch tensor does)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("ferry must not import it")

    def __dlpack_device__(self):
        return (2, 1)


def test_producers_in_device_memory_are_refused_naming_the_device():
    with pytest.raises(ferry.InvalidArgumentError, match="CUDA:1 memory"):
        ferry.from_dlpack(_DeviceMemoryProducer())
    with pytest.raises(ferry.InvalidArgumentError, match=r"item 0: a _DeviceMemoryProducer in CUDA:1"):
        ferry.device_put([_DeviceMemoryProducer()])
