"""What DLPack cannot say on its own: torch's lazy conjugate/negative views on the way in, and
read-only memory on the way out (versioned capsules, the READ_ONLY flag, copies)."""

import ctypes

import numpy as np
import pytest

import ferry

torch = pytest.importorskip("torch")


def test_conjugate_views_arrive_conjugated(device):
    rng = np.random.default_rng(14)
    print("seed 14")
    values = rng.standard_normal(64) + 1j * rng.standard_normal(64)
    t = torch.from_numpy(values.astype(np.complex64))
    view = t.conj()
    assert view.is_conj()  # a lazy view: the storage still holds the unconjugated values
    back = ferry.device_get(ferry.device_put(view, device))
    np.testing.assert_array_equal(back, values.astype(np.complex64).conj())
    # Batched, async and sharded puts go through the same door.
    batched = ferry.device_get(ferry.device_put([view, t], device, semantics="async"))
    np.testing.assert_array_equal(batched[0], values.astype(np.complex64).conj())
    np.testing.assert_array_equal(batched[1], values.astype(np.complex64))


def test_negative_views_arrive_negated(device):
    t = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex128)
    imag_of_conj = t.conj().imag  # a real view with the negative bit set
    assert imag_of_conj.is_neg()
    back = ferry.device_get(ferry.device_put(imag_of_conj, device))
    np.testing.assert_array_equal(back, [-2.0, 4.0, -0.5])


def test_conjugate_views_are_saved_conjugated(tmp_path):
    t = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    ferry.save_file({"c": t.conj()}, tmp_path / "c.npz")
    np.testing.assert_array_equal(np.load(tmp_path / "c.npz")["c"], [1 - 2j, 3 + 4j])


def aligned_read_only(n=4096):
    storage = np.arange(n + 16, dtype=np.float32)
    start = (-storage.ctypes.data % 64) // storage.itemsize
    x = storage[start:start + n]
    x.flags.writeable = False
    return x


def capsule_flags(capsule):
    """The flags field of a "dltensor_versioned" capsule's DLManagedTensorVersioned."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    pointer = get(capsule, b"dltensor_versioned")
    # version (2 x u32), manager_ctx, deleter, then the u64 flags.
    return ctypes.c_uint64.from_address(pointer + 8 + 2 * ctypes.sizeof(ctypes.c_void_p)).value


def test_a_zero_copy_alias_of_read_only_memory_is_never_exported_writable():
    x = aligned_read_only()
    expected = x.copy()
    ferry.reset_metrics()
    a = ferry.device_put(x, "host:0", semantics="zero_copy")
    assert ferry.metrics()["ZeroCopyAliases"] == 1
    # torch asks for a versioned capsule but ignores READ_ONLY: it gets a copy it may write.
    t = torch.from_dlpack(a)
    assert t.data_ptr() != x.ctypes.data
    t[0] = -1.0
    np.testing.assert_array_equal(x, expected)
    # numpy, and any consumer, the same by default; IS_COPIED says so.
    n = np.from_dlpack(a)
    assert n.ctypes.data != x.ctypes.data
    assert capsule_flags(a.__dlpack__(max_version=(1, 0))) == 2  # IS_COPIED
    # Insisting on no copy: a versioned capsule flagged READ_ONLY, which numpy honours ...
    capsule = a.__dlpack__(max_version=(1, 0), copy=False)
    assert capsule_flags(capsule) == 1  # READ_ONLY
    del capsule
    n = np.from_dlpack(a, copy=False)
    assert n.ctypes.data == x.ctypes.data and not n.flags.writeable
    # ... and an unversioned capsule cannot carry the flag: refused.
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__(copy=False)
    np.testing.assert_array_equal(a.to_numpy(), expected)


def test_a_zero_copy_put_of_a_mapped_file_is_exported_as_a_copy(tmp_path):
    path = tmp_path / "w.npy"
    np.save(path, np.arange(4096, dtype=np.float32))  # data at offset 128: 64-byte aligned
    w = ferry.open_file(path)["w"]
    assert not w.flags.writeable
    a = ferry.device_put(w, "host:0", semantics="zero_copy")
    t = torch.from_dlpack(a)
    t[:] = 7.0  # into the copy; writing the mapping itself would crash the process
    assert w[5] == 5.0


def test_writable_memory_is_still_exported_without_a_copy():
    a = ferry.device_put(np.arange(1000, dtype=np.float64), "host:0")  # the device's own memory
    first, second = np.from_dlpack(a), np.from_dlpack(a)
    assert first.ctypes.data == second.ctypes.data  # both view the device memory
    assert capsule_flags(a.__dlpack__(max_version=(1, 0))) == 0
    np.testing.assert_array_equal(first, np.arange(1000))


def test_capsules_other_than_dlpack_0_are_refused_with_what_to_pass():
    # A bare DLPack 0.x capsule is imported as it is (nanobind's import).
    np.testing.assert_array_equal(
        ferry.device_get(ferry.device_put(torch.arange(4.0).__dlpack__())), np.arange(4.0))
    # Before: a versioned capsule, or one a consumer had taken, was "neither a buffer nor a CPU
    # DLPack tensor", which sent the user looking at the tensor rather than at the capsule.
    versioned = torch.arange(4.0).__dlpack__(max_version=(1, 0))
    with pytest.raises(ferry.InvalidArgumentError, match="versioned DLPack capsule.*tensor itself"):
        ferry.from_dlpack(versioned)
    taken = torch.arange(4.0).__dlpack__()
    torch.from_dlpack(taken)
    with pytest.raises(ferry.InvalidArgumentError, match="taken already"):
        ferry.device_put(taken)


@pytest.mark.parametrize("versioned", [False, True])
def test_a_consumer_that_calls_the_deleter_and_leaves_the_capsule_unconsumed_is_survived(
        versioned):
    # torch_xla's from_dlpack, when it fails after taking the tensor, calls the DLPack deleter and
    # leaves the capsule named "dltensor": the capsule's destructor then called the deleter a
    # second time (a double free, the process aborted). Done here by hand, in a subprocess.
    code = f"""
    import ctypes, gc
    import numpy as np
    import ferry
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    a = ferry.device_put(np.arange(1000, dtype=np.float32))
    for _ in range(50):
        if {versioned}:
            capsule, name = a.__dlpack__(max_version=(1, 0)), b"dltensor_versioned"
            deleter_offset = 16   # version (8), manager_ctx (8), deleter
        else:
            capsule, name = a.__dlpack__(), b"dltensor"
            deleter_offset = 56   # DLTensor (48), manager_ctx (8), deleter
        managed = api.PyCapsule_GetPointer(capsule, name)
        deleter = ctypes.cast(ctypes.c_void_p.from_address(managed + deleter_offset).value,
                              ctypes.CFUNCTYPE(None, ctypes.c_void_p))
        deleter(managed)      # the consumer releases the tensor ...
        del capsule           # ... and the capsule, never renamed, dies unconsumed
        gc.collect()
    print("alive", float(ferry.device_get(a)[-1]), flush=True)
    """
    from conftest import run_python
    result = run_python(code, timeout=60)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "alive 999.0" in result.stdout, result.stdout
