"""Tensor files from Python: ferry.save_file / open_file / load_file against numpy and the real
safetensors library, bit for bit, in both directions; errors; the lifetime of zero-copy arrays."""

import gc
import io
import json
import os
import re

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import ferry
import ferry._testing

SEED = int(os.environ.get("FERRY_TEST_SEED", "7177"))

# Every dtype safetensors.numpy reads and writes; bf16 and float8 go through safetensors.torch.
SAFETENSORS_NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.complex64,
]
ML_DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
TORCH_OF_ML_DTYPE = {
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
    np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
}
TORCH_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SHAPES = [(), (0, 3), (5,), (3, 7), (2, 3, 4)]


@pytest.fixture
def rng(request):
    seed = SEED + sum(map(ord, request.node.name))
    print(f"seed {seed} (FERRY_TEST_SEED={SEED})")
    return np.random.default_rng(seed)


def random_array(rng, dtype, shape):
    """Random bits of `dtype` (NaNs with payloads included): a bit-for-bit comparison must hold."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=count).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def bits(a):
    """The row-major little-endian bytes of an array."""
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).tobytes()


def native(dtype):
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype


def assert_same_bits(got, want):
    assert got.shape == want.shape
    assert native(got.dtype) == native(want.dtype)  # big-endian file data stays big-endian
    assert bits(got) == bits(want)


def torch_bits(t):
    return t.contiguous().view(TORCH_BITS[t.element_size()]).numpy().tobytes()


def mapped(path):
    """Whether this process has `path` mapped (also after the file was removed)."""
    gc.collect()
    ferry._testing.drain_release_queue()
    path = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        return any(f" {path}" in line for line in maps)


# --- files ferry writes, read by the real libraries ---------------------------------------------


def test_safetensors_numpy_reads_every_dtype_ferry_writes(rng, tmp_path):
    tensors = {}
    for dtype in SAFETENSORS_NUMPY_DTYPES:
        for shape in SHAPES:
            tensors[f"{np.dtype(dtype).name}_{len(shape)}d"] = random_array(rng, dtype, shape)
    base = random_array(rng, np.float32, (6, 8))
    tensors["transposed"] = base.T
    tensors["reversed_step"] = base[::-2, 1::3]
    path = tmp_path / "ferry.safetensors"
    ferry.save_file(tensors, path, metadata={"format": "np", "note": "é"})

    loaded = safetensors.numpy.load_file(str(path))
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        assert_same_bits(loaded[name], want)
    with safetensors.safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "np", "note": "é"}


def test_safetensors_torch_reads_bf16_and_float8_ferry_writes(rng, tmp_path):
    tensors = {}
    for dtype in ML_DTYPES:
        for shape in SHAPES:
            tensors[f"{np.dtype(dtype).name}_{len(shape)}d"] = random_array(rng, dtype, shape)
    # torch tensors go in through DLPack, with their strides.
    source = torch.from_numpy(random_array(rng, np.float32, (9, 4))).to(torch.bfloat16)
    tensors["torch_bf16_transposed"] = source.T
    path = tmp_path / "ferry.safetensors"
    ferry.save_file(tensors, path)

    loaded = safetensors.torch.load_file(str(path))
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        got = loaded[name]
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch_bits(got) == torch_bits(want)
        else:
            assert got.dtype == TORCH_OF_ML_DTYPE[want.dtype] and tuple(got.shape) == want.shape
            assert torch_bits(got) == bits(want)


@pytest.mark.parametrize("compressed", [False, True])
def test_numpy_reads_npy_and_npz_ferry_writes(rng, tmp_path, compressed):
    dtypes = SAFETENSORS_NUMPY_DTYPES + [np.complex128]
    tensors = {f"{np.dtype(d).name}": random_array(rng, d, (3, 5)) for d in dtypes}
    tensors["fortran"] = np.asfortranarray(random_array(rng, np.int32, (4, 6)))
    tensors["scalar"] = random_array(rng, np.float64, ())
    tensors["empty"] = random_array(rng, np.int16, (0, 2))
    tensors["big_endian"] = random_array(rng, ">f4", (7,))
    npz = tmp_path / "ferry.npz"
    ferry.save_file(tensors, npz, compressed=compressed)
    with np.load(npz) as loaded:
        assert sorted(loaded.files) == sorted(tensors)
        for name, want in tensors.items():
            assert_same_bits(loaded[name], want)

    for name, want in tensors.items():
        npy = tmp_path / f"{name}.npy"
        ferry.save_file({name: want}, npy)
        assert_same_bits(np.load(npy), want)
    ferry.save_file(tensors["fortran"].T, tmp_path / "bare.npy")  # an array, not a dict
    assert_same_bits(np.load(tmp_path / "bare.npy"), tensors["fortran"].T)


# --- files the real libraries write, read by ferry ----------------------------------------------


def test_ferry_reads_safetensors_numpy_files(rng, tmp_path):
    tensors = {}
    for dtype in SAFETENSORS_NUMPY_DTYPES:
        for shape in SHAPES:
            tensors[f"{np.dtype(dtype).name}_{len(shape)}d"] = random_array(rng, dtype, shape)
    path = tmp_path / "reference.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata={"framework": "numpy"})

    opened = ferry.open_file(path)
    assert opened.format == "safetensors" and opened.metadata == {"framework": "numpy"}
    assert sorted(opened) == sorted(tensors)
    for name, want in tensors.items():
        assert_same_bits(opened[name], want)
        assert opened.zero_copy(name) and not opened.byte_swapped(name)
    loaded = ferry.load_file(path)
    assert isinstance(loaded, dict) and list(loaded) == list(opened)


def test_ferry_reads_safetensors_torch_files(rng, tmp_path):
    tensors = {}
    for dtype in [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16,
                  torch.float32, torch.int64, torch.bool, torch.uint16, torch.uint32,
                  torch.uint64, torch.complex64]:
        for shape in SHAPES:
            raw = random_array(rng, np.uint8, shape + (torch.empty((), dtype=dtype).element_size(),))
            t = torch.from_numpy(raw).view(dtype).reshape(shape)
            if dtype == torch.bool:
                t = torch.from_numpy(random_array(rng, np.bool_, shape))
            tensors[f"{str(dtype).removeprefix('torch.')}_{len(shape)}d"] = t
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})

    loaded = ferry.load_file(path)
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        got = loaded[name]
        assert got.shape == tuple(want.shape)
        assert got.dtype.itemsize == want.element_size()
        assert bits(got) == torch_bits(want)
    assert loaded["bfloat16_1d"].dtype == ml_dtypes.bfloat16
    assert loaded["float8_e4m3fn_1d"].dtype == ml_dtypes.float8_e4m3fn
    assert loaded["float8_e5m2_1d"].dtype == ml_dtypes.float8_e5m2
    assert ferry.open_file(path).metadata == {"format": "pt"}


NPY_DTYPES = [
    "<f4", ">f4", ">i8", "<i8", ">f8", ">i2", "|b1", "|u1", "|i1", "<u4", "<f2", ">f2",
    "<c8", ">c8", "<c16", ">c16",
]


@pytest.mark.parametrize("dtype", NPY_DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_ferry_reads_numpy_save(rng, tmp_path, dtype, order):
    for shape in SHAPES:
        want = random_array(rng, dtype, shape)
        if order == "F":
            want = np.asfortranarray(want)
        path = tmp_path / f"x{len(shape)}.npy"
        np.save(path, want)
        opened = ferry.open_file(path)
        assert opened.format == "npy" and list(opened) == [f"x{len(shape)}"]
        got = opened[f"x{len(shape)}"]
        assert_same_bits(got, want)
        big_endian = np.dtype(dtype).byteorder == ">"
        assert opened.byte_swapped(f"x{len(shape)}") == big_endian
        # Big-endian data is viewed in the file too: the copy to a device swaps it on the way.
        assert opened.zero_copy(f"x{len(shape)}")
        if order == "F" and len(shape) > 1:
            assert got.flags.f_contiguous  # a column-major view of the file, not a copy


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_ferry_reads_every_npy_header_version(rng, tmp_path, version):
    want = random_array(rng, "<f8", (4, 3))
    path = tmp_path / "versioned.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, want, version=version)
    assert_same_bits(ferry.load_file(path)["versioned"], want)


@pytest.mark.parametrize("compressed", [False, True])
def test_ferry_reads_numpy_savez(rng, tmp_path, compressed):
    tensors = {
        "weight": random_array(rng, "<f4", (16, 8)),
        "big": random_array(rng, ">i8", (5,)),
        "fortran": np.asfortranarray(random_array(rng, "<c16", (3, 4))),
        "flags": random_array(rng, "|b1", (9,)),
        "scalar": random_array(rng, "<u2", ()),
        "empty": random_array(rng, "<f2", (0,)),
    }
    path = tmp_path / "archive.npz"
    (np.savez_compressed if compressed else np.savez)(path, **tensors)
    opened = ferry.open_file(path)
    assert opened.format == "npz" and list(opened) == list(tensors)  # archive order
    for name, want in tensors.items():
        assert_same_bits(opened[name], want)
        assert opened.zero_copy(name) == (not compressed)
        assert opened.byte_swapped(name) == (name == "big")


# --- round trips and the device path -------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_ferry_round_trip_and_load_onto_a_device(rng, tmp_path, suffix, device):
    tensors = {
        "a": random_array(rng, np.float32, (33, 17)),
        "b": random_array(rng, np.int64, (5,)),
        "c": random_array(rng, np.float16, (2, 2, 2)),
    }
    if suffix == ".safetensors":
        tensors["d"] = random_array(rng, ml_dtypes.bfloat16, (64,))
    path = tmp_path / f"round{suffix}"
    ferry.save_file(tensors, path)
    loaded = ferry.load_file(path)
    for name, want in tensors.items():
        assert_same_bits(loaded[name], want)
    del loaded
    assert not mapped(path)

    arrays = ferry.load_file(path, device)
    assert sorted(arrays) == sorted(tensors)
    for name, array in arrays.items():
        assert isinstance(array, ferry.Array) and array.device == device
        assert_same_bits(array.to_numpy(), tensors[name])
    assert not mapped(path)  # the put has read the file and let the mapping go

    converted = ferry.load_file(path, device, device_dtype="float32")
    assert converted["c"].device_dtype == "float32" and converted["c"].dtype == np.float16
    np.testing.assert_array_equal(converted["c"].to_numpy(), tensors["c"])


# --- zero-copy arrays: read-only, and alive exactly as long as needed ---------------------------


def test_arrays_outlive_the_file_object_and_release_the_mapping(rng, tmp_path):
    want = {f"t{i}": random_array(rng, np.float32, (1024, 16)) for i in range(4)}
    path = tmp_path / "lifetime.safetensors"
    ferry.save_file(want, path)

    opened = ferry.open_file(path)
    assert all(opened.zero_copy(name) for name in opened)
    first = opened["t0"]
    tail = opened["t3"][100:]  # a numpy view of a view: it too holds the file
    del opened
    gc.collect()
    assert mapped(path)
    assert_same_bits(first, want["t0"])
    assert_same_bits(tail, want["t3"][100:])

    del first
    gc.collect()
    assert mapped(path)  # `tail` still holds it
    assert_same_bits(tail, want["t3"][100:])
    del tail
    gc.collect()
    assert not mapped(path)

    loaded = ferry.load_file(path)
    array = loaded["t2"]
    del loaded
    gc.collect()
    os.remove(path)  # the mapping keeps the old pages
    assert mapped(path)
    assert_same_bits(array, want["t2"])
    del array
    gc.collect()
    assert not mapped(path)


def test_arrays_are_read_only(rng, tmp_path):
    path = tmp_path / "ro.npy"
    np.save(path, random_array(rng, np.int32, (8,)))
    array = ferry.load_file(path)["ro"]
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 1
    copy = np.array(array)  # a writable copy that does not hold the file
    copy[0] = 1
    del array
    gc.collect()
    assert not mapped(path)


# --- errors -------------------------------------------------------------------------------------


def write_bytes(path, data):
    path.write_bytes(data)
    return path


def npy_bytes(header, data):
    """A version 1.0 .npy file with `header` (a dict literal, not checked here) and `data`."""
    encoded = header.encode("latin1")
    encoded += b" " * ((-(10 + len(encoded) + 1)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(encoded).to_bytes(2, "little") + encoded + data


def test_malformed_files_raise_errors_naming_the_file(rng, tmp_path):
    good = tmp_path / "good.safetensors"
    ferry.save_file({"w": random_array(rng, np.float32, (64,))}, good)
    data = good.read_bytes()
    npy = tmp_path / "good.npy"
    np.save(npy, random_array(rng, np.float32, (64,)))
    npz = tmp_path / "good.npz"
    np.savez(npz, w=random_array(rng, np.float32, (64,)))
    cases = {
        "truncated.safetensors": (data[:-4], "truncated"),
        "trailing.safetensors": (data + b"\0" * 8, "trailing bytes"),
        "header.safetensors": (data[:8] + b"[" + data[9:], "not valid JSON"),
        "tiny.safetensors": (b"\x01\x02", "too small"),
        "truncated.npy": (npy.read_bytes()[:-1], "truncated"),
        "object.npy": (npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }",
                                 b"\0" * 8), "object"),
        "shape.npy": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                b"\0" * 12), "follow the array data"),
        "truncated.npz": (npz.read_bytes()[:-30], "end-of-central-directory"),
    }
    for name, (contents, words) in cases.items():
        path = write_bytes(tmp_path / name, contents)
        with pytest.raises(ferry.InvalidArgumentError, match=re.escape(f"file '{path}'")) as error:
            ferry.load_file(path)
        assert isinstance(error.value, ValueError)
        assert words in str(error.value)
        assert not mapped(path)

    with pytest.raises(ferry.NotFoundError, match="missing.safetensors"):
        ferry.load_file(tmp_path / "missing.safetensors")


def safetensors_bytes(header, data=b""):
    """A safetensors file with `header` (bytes, not checked here) and `data`."""
    return len(header).to_bytes(8, "little") + header + data


def reference_reads(contents):
    """Whether the real safetensors (its Rust reader, without numpy's limits) accepts the file."""
    try:
        safetensors.deserialize(contents)
        return True
    except Exception:  # noqa: BLE001 - the reference raises a SafetensorError of its own
        return False


def numpy_reads(contents):
    try:
        np.load(io.BytesIO(contents))
        return True
    except ValueError:
        return False


def test_json_error_at_a_non_ascii_character_is_a_ferry_error_quoting_whole_characters(tmp_path):
    # The parser stops at the first byte of 'é'; the message used to quote that byte alone, which
    # Python could not decode (UnicodeDecodeError instead of ferry.Error).
    path = write_bytes(tmp_path / "bad.safetensors", safetensors_bytes('{"t": é}'.encode()))
    with pytest.raises(ferry.InvalidArgumentError) as error:
        ferry.open_file(path)
    assert 'not valid JSON' in str(error.value)
    assert 'at header byte 6: "é}"' in str(error.value)
    path = write_bytes(tmp_path / "emoji.safetensors",
                       safetensors_bytes('{"a":1,"t":[1,\U0001F600]}'.encode()))
    with pytest.raises(ferry.InvalidArgumentError, match=re.escape('"\U0001F600]}"')):
        ferry.open_file(path)


def test_names_from_a_file_are_quoted_escaped_in_errors(tmp_path):
    header = json.dumps({"w\x1b[31m\n": {"dtype": "X\x07", "shape": [1], "data_offsets": [0, 1]}})
    path = write_bytes(tmp_path / "names.safetensors", safetensors_bytes(header.encode(), b"a"))
    with pytest.raises(ferry.InvalidArgumentError) as error:
        ferry.open_file(path)
    message = str(error.value)
    assert "tensor 'w\\x1b[31m\\n'" in message
    assert 'unsupported dtype "X\\x07"' in message
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in message)


def test_a_name_with_no_utf8_form_is_refused_saying_so(tmp_path):
    # A lone surrogate (what os.fsdecode makes of undecodable bytes) has no UTF-8 form, which files
    # hold names in. Before: nanobind's "_save_file(): incompatible function arguments".
    w = np.arange(3, dtype=np.float32)
    lone = "w\udcff"
    with pytest.raises(ferry.InvalidArgumentError, match=r"name 'w\\udcff' is not valid UTF-8"):
        ferry.save_file({lone: w}, tmp_path / "bad.safetensors")
    with pytest.raises(ferry.InvalidArgumentError, match=r"key 'w\\udcff' is not valid UTF-8"):
        ferry.save_file({"w": w}, tmp_path / "bad.safetensors", metadata={lone: "x"})
    assert not list(tmp_path.iterdir())  # nothing written
    # As a selector it is the name of no tensor in a UTF-8 file (a .npy file named by bytes that
    # are not UTF-8 has one: test_a_npy_file_whose_name_is_not_utf8_loads_under_that_name).
    path = tmp_path / "w.safetensors"
    ferry.save_file({"w": w}, path)
    for load in (ferry.open_file, ferry.load_file,
                 lambda path, **kwargs: ferry.load_file(path, "host:0", **kwargs)):
        for argument in ("names", "pattern"):
            with pytest.raises(ferry.NotFoundError, match=r"w\\xff"):
                load(path, **{argument: ["w", lone]})
        assert list(load(path, exclude=[lone]).keys()) == ["w"]


def test_byte_order_mark_before_the_json_is_refused_as_the_reference_does(tmp_path):
    header = b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    contents = safetensors_bytes(b"\xef\xbb\xbf" + header, b"a")
    assert reference_reads(safetensors_bytes(header, b"a"))
    assert not reference_reads(contents)
    path = write_bytes(tmp_path / "bom.safetensors", contents)
    with pytest.raises(ferry.InvalidArgumentError, match="byte-order mark"):
        ferry.open_file(path)


@pytest.mark.parametrize("levels", [127, 128])
def test_json_nesting_is_limited_where_the_reference_limits_it(tmp_path, levels):
    inner = levels - 2  # the outer object and the entry are two levels
    header = ('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + "[" * inner +
              "]" * inner + "}}").encode()
    contents = safetensors_bytes(header, b"a")
    path = write_bytes(tmp_path / "deep.safetensors", contents)
    if reference_reads(contents):
        assert levels == 127
        assert_same_bits(ferry.load_file(path)["t"], np.frombuffer(b"a", np.uint8))
    else:
        assert levels == 128
        with pytest.raises(ferry.InvalidArgumentError, match="nests deeper than 127 levels"):
            ferry.open_file(path)


@pytest.mark.parametrize("descr,shape", [
    ("<f4", (0, 2**62)), ("<f8", (2**60, 0)), ("|u1", (3, 0, 2**62)),  # numpy: "array is too big"
    ("|u1", (0, 2**62)), ("<f8", (0, 2**59)),                           # numpy makes these
])
def test_empty_npy_with_huge_dims_follows_numpy(tmp_path, descr, shape):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    contents = npy_bytes(header, b"")
    path = write_bytes(tmp_path / "empty.npy", contents)
    if numpy_reads(contents):
        assert ferry.load_file(path)["empty"].shape == shape
    else:
        with pytest.raises(ferry.InvalidArgumentError, match="array is too big"):
            ferry.open_file(path)
    # safetensors: the reference accepts every empty shape; ferry follows numpy there too.
    names = {"<f4": "F32", "<f8": "F64", "|u1": "U8"}
    entry = {"dtype": names[descr], "shape": list(shape), "data_offsets": [0, 0]}
    path = write_bytes(tmp_path / "empty.safetensors",
                       safetensors_bytes(json.dumps({"t": entry}).encode()))
    if numpy_reads(contents):
        assert ferry.load_file(path)["t"].shape == shape
    else:
        with pytest.raises(ferry.InvalidArgumentError, match="array is too big"):
            ferry.open_file(path)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_python2_long_suffixes_in_npy_headers_are_read_as_numpy_reads_them(rng, tmp_path, version):
    want = random_array(rng, np.uint32, (3, 6))
    header = "{'descr': '<u4', 'fortran_order': False, 'shape': (3L, 6L), }".encode("latin1")
    prefix = 10 if version == 1 else 12
    header += b" " * ((-(prefix + len(header) + 1)) % 64) + b"\n"
    contents = (b"\x93NUMPY" + bytes([version, 0]) +
                len(header).to_bytes(2 if version == 1 else 4, "little") + header + want.tobytes())
    path = write_bytes(tmp_path / "old.npy", contents)
    if version < 3:
        with pytest.warns(UserWarning, match="Python 2"):
            assert_same_bits(np.load(path), want)
        assert_same_bits(ferry.load_file(path)["old"], want)
    else:
        assert not numpy_reads(contents)
        with pytest.raises(ferry.InvalidArgumentError, match="version 1.0 and 2.0 headers only"):
            ferry.open_file(path)


# Every dtype the reference reads and ferry does not (docs/files.md names each), with a shape
# whose bits fill the one data byte.
REFERENCE_ONLY_DTYPES = {"F8_E8M0": [1], "F8_E4M3FNUZ": [1], "F8_E5M2FNUZ": [1], "F4": [2],
                         "F6_E2M3": [4], "F6_E3M2": [4]}


@pytest.mark.parametrize("dtype", sorted(REFERENCE_ONLY_DTYPES))
def test_dtypes_only_the_reference_reads_are_refused_by_name(tmp_path, dtype):
    shape = REFERENCE_ONLY_DTYPES[dtype]
    data = b"abc"[: 3 if dtype.startswith("F6") else 1]
    entry = {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}
    contents = safetensors_bytes(json.dumps({"t": entry}).encode(), data)
    assert reference_reads(contents)
    path = write_bytes(tmp_path / "x.safetensors", contents)
    with pytest.raises(ferry.InvalidArgumentError, match=f'unsupported dtype "{dtype}"'):
        ferry.open_file(path)


def test_save_file_refuses_what_a_format_cannot_hold(rng, tmp_path):
    bf16 = random_array(rng, ml_dtypes.bfloat16, (4,))
    with pytest.raises(ferry.InvalidArgumentError, match="bfloat16"):
        ferry.save_file({"x": bf16}, tmp_path / "x.npy")
    with pytest.raises(ferry.InvalidArgumentError, match="complex128"):
        ferry.save_file({"x": random_array(rng, np.complex128, (2,))}, tmp_path / "x.safetensors")
    with pytest.raises(ferry.InvalidArgumentError, match="extension"):
        ferry.save_file({"x": bf16}, tmp_path / "x.bin")
    with pytest.raises(ferry.InvalidArgumentError, match="metadata"):
        ferry.save_file({"x": np.ones(2)}, tmp_path / "x.npz", metadata={"a": "b"})
    with pytest.raises(ferry.InvalidArgumentError, match="compressed"):
        ferry.save_file({"x": np.ones(2)}, tmp_path / "x.safetensors", compressed=True)
    with pytest.raises(ferry.InvalidArgumentError, match="exactly one"):
        ferry.save_file({"x": np.ones(2), "y": np.ones(2)}, tmp_path / "x.npy")
    with pytest.raises(ferry.InvalidArgumentError, match="__metadata__"):
        ferry.save_file({"__metadata__": np.ones(2)}, tmp_path / "x.safetensors")
    # Nothing is left under the final name, nor half-written beside it.
    assert sorted(os.listdir(tmp_path)) == []

    with pytest.raises(ferry.NotFoundError):
        ferry.save_file({"x": np.ones(2)}, tmp_path / "no" / "such" / "dir.safetensors")

    ferry.save_file({"x": bf16}, tmp_path / "x.bin", format="safetensors")
    assert_same_bits(ferry.load_file(tmp_path / "x.bin")["x"], bf16)


@pytest.mark.parametrize("dtype", [">f4", ">i2", ">c16", ">f2"])
def test_big_endian_npy_goes_to_devices_swapped_on_the_way(rng, tmp_path, dtype, device):
    # Finite values: a device that stores float16 as float32 (PoCL) quiets signalling NaNs, as the
    # conversion rules say, so raw random bits would not come back bit for bit there.
    if np.dtype(dtype).kind in "fc":
        want = np.asfortranarray((rng.standard_normal((6, 5)) * 100).astype(dtype))
    else:
        want = np.asfortranarray(random_array(rng, dtype, (6, 5)))
    path = tmp_path / "big.npy"
    np.save(path, want)
    got = ferry.load_file(path, device)["big"].to_numpy()
    assert_same_bits(got, want.astype(np.dtype(dtype).newbyteorder("<")))


@pytest.mark.parametrize("as_bytes", [False, True])
def test_paths_that_are_not_utf8_are_opened_loaded_and_written(tmp_path, as_bytes):
    # A name os.listdir gives back with surrogates (latin-1 bytes on a UTF-8 system), or as bytes.
    raw = os.fsencode(tmp_path) + b"/lat\xe9.safetensors"
    path = raw if as_bytes else os.fsdecode(raw)
    expected = np.arange(6, dtype=np.float32).reshape(2, 3)
    ferry.save_file({"w": expected}, path)
    assert os.path.exists(raw)
    np.testing.assert_array_equal(ferry.open_file(path)["w"], expected)
    np.testing.assert_array_equal(ferry.load_file(path)["w"], expected)
    np.testing.assert_array_equal(ferry.load_file(path, "host:0")["w"].to_numpy(), expected)
    with pytest.raises(ferry.NotFoundError, match=r"missing\\xe9\.npy"):  # escaped
        ferry.open_file(os.fsdecode(os.fsencode(tmp_path) + b"/missing\xe9.npy"))


def test_a_tensor_of_more_dimensions_than_numpy_has_is_a_ferry_error(tmp_path):
    shape = [1] * 64 + [2]
    header = json.dumps({"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "rank65.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + np.ones(2, np.float32).tobytes())
    with pytest.raises(ferry.InvalidArgumentError,
                       match="rank65.safetensors:a' has 65 dimensions, and a numpy array has at most 64"):
        ferry.open_file(path)
    # On a device it is a tensor like any other; only its numpy view is refused, by ferry.
    on_device = ferry.load_file(path, "host:0")["a"]
    assert on_device.shape == tuple(shape)
    with pytest.raises(ferry.InvalidArgumentError, match="has 65 dimensions"):
        ferry.device_get(on_device)


def test_a_npy_file_whose_name_is_not_utf8_loads_under_that_name(tmp_path):
    # A .npy file's tensor is named by its file's stem, bytes that need not be UTF-8: the name
    # comes back as os.fsdecode gives it (surrogates) instead of raising UnicodeDecodeError.
    path = os.path.join(os.fsencode(tmp_path), b"w\xff.npy")
    np.save(os.fsdecode(path), np.arange(3.0))
    for loaded in (ferry.load_file(path), ferry.load_file(os.fsdecode(path), "host:0"),
                   ferry.open_file(path)):
        assert list(loaded.keys()) == [os.fsdecode(b"w\xff")]
        np.testing.assert_array_equal(np.asarray(loaded[os.fsdecode(b"w\xff")]), np.arange(3.0))
    # The name given back selects the tensor again.
    name = os.fsdecode(b"w\xff")
    for load in (ferry.open_file, ferry.load_file,
                 lambda path, **kwargs: ferry.load_file(path, "host:0", **kwargs)):
        assert list(load(path, names=[name]).keys()) == [name]
        assert list(load(os.fsdecode(path), pattern=name[:1] + "*").keys()) == [name]
