"""Writes the fuzzers' seed corpus: small valid files from the real writers (numpy, safetensors)
and small invalid ones that each break one rule. Files named valid_* must parse and invalid_* must
be refused; tests/io/fuzz_corpus_replay_test.cc replays them all in the normal test suite.

    .venv/bin/python fuzz/make_corpus.py
"""

import io
import json
import pathlib
import shutil
import struct
import zipfile
import zlib

import numpy as np
from safetensors.numpy import save

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"


def write(folder, name, data):
    (ROOT / folder).mkdir(parents=True, exist_ok=True)
    (ROOT / folder / name).write_bytes(data)


def safetensors_bytes(header, data=b"", pad=True):
    text = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def npy_bytes(array, **kwargs):
    buffer = io.BytesIO()
    np.save(buffer, array, **kwargs)
    return buffer.getvalue()


def npy_raw(dict_text, data, major=1):
    header = dict_text.encode("latin1")
    prefix = 10 if major == 1 else 12
    header += b" " * (-(prefix + len(header) + 1) % 64) + b"\n"
    length = struct.pack("<H", len(header)) if major == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + length + header + data


def npz_bytes(compressed=False, **arrays):
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


def safetensors_corpus():
    tensors = {
        "weight": np.arange(6, dtype=np.float32).reshape(2, 3),
        "bias": np.arange(3, dtype=np.float16),
        "ids": np.arange(4, dtype=np.int64),
        "mask": np.array([True, False]),
    }
    write("safetensors", "valid_dtypes", save(tensors))
    write("safetensors", "valid_metadata", save({"x": np.ones(2, np.uint8)}, metadata={"format": "np"}))
    write("safetensors", "valid_empty", safetensors_bytes({}))
    write("safetensors", "valid_scalar_and_empty", safetensors_bytes(
        {"s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
         "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}}, struct.pack("<d", 1.5)))
    write("safetensors", "valid_float8", safetensors_bytes(
        {"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]},
         "b": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [2, 4]}}, b"\x01\x02\x03\x04"))
    write("safetensors", "valid_whitespace", safetensors_bytes(
        b'  {"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}  ', b"ab"))
    one = lambda entry, data: safetensors_bytes({"t": entry}, data)
    write("safetensors", "invalid_gap", safetensors_bytes(
        {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
         "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]}}, b"abc"))
    write("safetensors", "invalid_overlap", safetensors_bytes(
        {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
         "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"abc"))
    write("safetensors", "invalid_trailing", one({"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, b"ab"))
    write("safetensors", "invalid_truncated", one({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, b"ab"))
    write("safetensors", "invalid_size_mismatch", one({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, b"abcd"))
    write("safetensors", "invalid_dtype_f8_e8m0", one({"dtype": "F8_E8M0", "shape": [1], "data_offsets": [0, 1]}, b"a"))
    write("safetensors", "invalid_negative_dim", one({"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}, b""))
    write("safetensors", "invalid_overflow", one(
        {"dtype": "U8", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}, b""))
    write("safetensors", "invalid_metadata", safetensors_bytes({"__metadata__": {"k": 1}}))
    write("safetensors", "invalid_duplicate", safetensors_bytes(
        b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
        b"ab"))
    write("safetensors", "invalid_utf8", safetensors_bytes(b'{"\xc3\x28":{}}'))
    write("safetensors", "invalid_json", safetensors_bytes(b'{"t":'))
    write("safetensors", "invalid_nul_in_header", safetensors_bytes(b'{}\x00{"t":1}', pad=False))
    write("safetensors", "invalid_header_too_large", struct.pack("<Q", 100_000_001) + b"{}")
    write("safetensors", "invalid_header_past_end", struct.pack("<Q", 64) + b"{}")


def npy_corpus():
    write("npy", "valid_f32", npy_bytes(np.arange(12, dtype=np.float32).reshape(3, 4)))
    write("npy", "valid_fortran", npy_bytes(np.asfortranarray(np.arange(6).reshape(2, 3))))
    write("npy", "valid_bigendian", npy_bytes(np.arange(4, dtype=">f8")))
    write("npy", "valid_bigendian_complex", npy_bytes(np.arange(2, dtype=">c16")))
    write("npy", "valid_scalar", npy_bytes(np.float64(2.5)))
    write("npy", "valid_bool", npy_bytes(np.array([True, False, True])))
    write("npy", "valid_empty", npy_bytes(np.zeros((0, 2), dtype=np.int16)))
    write("npy", "valid_v2", npy_raw("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", b"\x01\x00\x02\x00", 2))
    write("npy", "valid_v3", npy_raw("{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", b"\x01\x00\x02\x00", 3))
    write("npy", "invalid_object", npy_bytes(np.array([1, "a"], dtype=object), allow_pickle=True))
    write("npy", "invalid_structured", npy_bytes(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])))
    write("npy", "invalid_unicode", npy_bytes(np.array(["ab", "c"])))
    write("npy", "invalid_truncated", npy_bytes(np.arange(8, dtype=np.int32))[:-3])
    write("npy", "invalid_trailing", npy_bytes(np.arange(2, dtype=np.int32)) + b"xx")
    write("npy", "invalid_version", b"\x93NUMPY\x04\x00" + npy_bytes(np.int8(1))[8:])
    write("npy", "invalid_shape_int", npy_raw("{'descr': '<f4', 'fortran_order': False, 'shape': (3), }", b"\x00" * 12))
    write("npy", "invalid_missing_key", npy_raw("{'descr': '<f4', 'shape': (1,), }", b"\x00" * 4))
    write("npy", "invalid_header_length", b"\x93NUMPY\x01\x00\xff\xff{}")


def zip_member(name, data, method, crc=None, size=None):
    """A local header (with numpy's zip64 extra) and a central directory entry."""
    stored = zlib.compress(data)[2:-4] if method == 8 else data
    crc = zlib.crc32(data) if crc is None else crc
    size = len(data) if size is None else size
    name_bytes = name.encode()
    extra = struct.pack("<HHQQ", 1, 16, size, len(stored))
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, method, 0, 0x21, crc, 0xFFFFFFFF,
                        0xFFFFFFFF, len(name_bytes), len(extra)) + name_bytes + extra + stored
    return local, lambda offset: struct.pack(
        "<IHHHHHHIIIHHHHHII", 0x02014B50, 0x032D, 45, 0, method, 0, 0x21, crc, len(stored), size,
        len(name_bytes), 0, 0, 0, 0, 0, offset) + name_bytes


def zip_archive(members, zip64_end=False):
    body, directory = b"", b""
    for local, central in members:
        directory += central(len(body))
        body += local
    end = b""
    if zip64_end:
        end += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x032D, 45, 0, 0, len(members), len(members),
                           len(directory), len(body))
        end += struct.pack("<IIQI", 0x07064B50, 0, len(body) + len(directory), 1)
    end += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory),
                       len(body), 0)
    return body + directory + end


def npz_corpus():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(3, dtype=">i2")}
    write("npz", "valid_savez", npz_bytes(**arrays))
    write("npz", "valid_savez_compressed", npz_bytes(compressed=True, **arrays))
    write("npz", "valid_empty", npz_bytes())
    member = npy_bytes(np.arange(3, dtype=np.int32))
    write("npz", "valid_zip64_end_records", zip_archive([zip_member("a.npy", member, 0)], zip64_end=True))
    write("npz", "invalid_crc_deflated", zip_archive([zip_member("a.npy", member, 8, crc=1)]))
    write("npz", "invalid_method", zip_archive([zip_member("a.npy", member, 12)]))
    write("npz", "invalid_not_npy", zip_archive([zip_member("notes.txt", b"hello", 0)]))
    write("npz", "invalid_member_npy", zip_archive([zip_member("a.npy", b"not npy", 0)]))
    write("npz", "invalid_duplicate", zip_archive([zip_member("a.npy", member, 0)] * 2))
    write("npz", "invalid_truncated", npz_bytes(**arrays)[:-10])
    write("npz", "invalid_bomb_size", zip_archive([zip_member("a.npy", member, 8, size=0xFFFFFFFE)]))


def main():
    shutil.rmtree(ROOT, ignore_errors=True)
    safetensors_corpus()
    npy_corpus()
    npz_corpus()


if __name__ == "__main__":
    main()
