"""Writes the fixture files that tests/io/numpy_fixtures_test.cc reads, with the real libraries.

Run from anywhere with the project's Python (numpy 2, safetensors):
    .venv/bin/python tests/io/data/make_fixtures.py
Every value is a simple formula of its index, restated in the C++ test, so that the test checks
ferry's reading bit for bit without reading numpy's output back through numpy.
"""

import pathlib

import numpy as np
from safetensors.numpy import save_file

HERE = pathlib.Path(__file__).resolve().parent


def arange_f32():
    # 0, 0.5, 1.0, ... : exact in every float type.
    return (np.arange(12, dtype=np.float32) * 0.5).reshape(3, 4)


def main():
    # .npy: the layouts ferry must read.
    np.save(HERE / "arange_f32_3x4.npy", arange_f32())
    np.save(HERE / "fortran_i64_2x3.npy", np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)))
    np.save(HERE / "bigendian_f8_5.npy", (np.arange(5, dtype=np.float64) * 0.25 - 1).astype(">f8"))
    np.save(HERE / "bigendian_c8_3.npy", (np.arange(3) + 1j * (np.arange(3) - 1)).astype(">c8"))
    np.save(HERE / "bigendian_fortran_i2_3x2.npy",
            np.asfortranarray((np.arange(6, dtype=np.int16) - 3).reshape(3, 2)).astype(">i2", order="F"))
    np.save(HERE / "scalar_f64.npy", np.float64(3.25))
    np.save(HERE / "bool_5.npy", np.arange(5) % 2 == 0)
    np.save(HERE / "empty_f32_0x3.npy", np.zeros((0, 3), dtype=np.float32))
    np.save(HERE / "u16_2x2x2.npy", np.arange(8, dtype=np.uint16).reshape(2, 2, 2) * 1000)

    # .npz: stored (savez) and deflated (savez_compressed), with zip64 local extra fields.
    members = {
        "weight": arange_f32(),
        "ids": np.arange(7, dtype=np.int32) * -3,
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
    }
    np.savez(HERE / "savez.npz", **members)
    np.savez_compressed(HERE / "savez_compressed.npz", **members)

    # safetensors, with metadata.
    save_file(
        {
            "weight": arange_f32(),
            "bias": np.arange(4, dtype=np.float16) - 2,
            "ids": np.arange(5, dtype=np.int64) * 1000000007,
            "mask": np.arange(3) % 2 == 1,
        },
        str(HERE / "tensors.safetensors"),
        metadata={"format": "np", "source": "make_fixtures.py"},
    )


if __name__ == "__main__":
    main()
