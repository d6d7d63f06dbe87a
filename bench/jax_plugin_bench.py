"""JAX's transfers through ferry's PJRT plugin against the wrapped plugin alone (docs/jax.md).

Both are registered in this one JAX process ("ferry": ferry_pjrt_plugin.so wrapping the plugin;
"wrapped": the same plugin file alone), and every case runs through both, interleaved, in the same
run. Cases (at the default --size 8192):
- dense: an 8192 x 8192 f32 array (256 MiB), as numpy allocates it (16-byte aligned: JAX's
  zero-copy request cannot alias it, so both copy);
- dense_aligned: the same array at a 64-byte-aligned address (the wrapped plugin aliases it, and
  ferry passes it to the plugin for that);
- transposed: the transpose of a 4096 x 4096 f32 array (a view);
- strided: every other row and column of an 8192 x 8192 f32 array (a view);
- bf16_from_f32: a 4096 x 4096 f32 array put as bfloat16, which JAX casts on the host first
  (x.astype(bfloat16) is inside the timed region, for both).
For each: jax.device_put(x, device).block_until_ready() ("put") and np.asarray of a fresh device
array ("get"; JAX caches an array's numpy value, so each repeat reads a new one). Medians of
--repeats after one warm-up. Prints a table, then one JSON object on the last line.

    python bench/jax_plugin_bench.py [--size 8192] [--repeats 7] [--wrapped PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np


def default_wrapped() -> str:
    import xla_plugins.xla_cpu_pjrt as package

    return os.path.join(os.path.dirname(package.__file__), "xla_cpu_pjrt.so")


def aligned_copy(array: np.ndarray, alignment: int = 64) -> np.ndarray:
    memory = np.empty(array.nbytes + alignment, dtype=np.uint8)
    start = -memory.ctypes.data % alignment
    aligned = memory[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    aligned[...] = array
    return aligned


def make_cases(size: int):
    rng = np.random.default_rng(0)
    half = size // 2
    big = rng.standard_normal((size, size), dtype=np.float32)
    big_aligned = aligned_copy(big)
    square = rng.standard_normal((half, half), dtype=np.float32)
    return {
        "dense": (lambda: big, big.nbytes),
        "dense_aligned": (lambda: big_aligned, big.nbytes),
        "transposed": (lambda: square.T, square.nbytes),
        "strided": (lambda: big[::2, ::2], big.nbytes // 4),
        "bf16_from_f32": (lambda: square.astype(ml_dtypes.bfloat16), square.nbytes),
    }


def median_seconds(run, repeats: int, prepare=None) -> float:
    times = []
    for index in range(repeats + 1):
        argument = prepare() if prepare else None
        start = time.perf_counter()
        run(argument)
        elapsed = time.perf_counter() - start
        if index > 0:  # the first is the warm-up
            times.append(elapsed)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192, help="side of the large square arrays")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--wrapped", default=None, help="the plugin to wrap (default: xla_cpu_pjrt)")
    args = parser.parse_args()
    wrapped = args.wrapped or default_wrapped()

    import ferry.jax

    ferry.jax.register(wrapped, priority=0)
    from jax._src import xla_bridge

    xla_bridge.register_plugin("wrapped", library_path=wrapped, priority=0)
    import jax

    devices = {"ferry": jax.devices("ferry")[0], "wrapped": jax.devices("wrapped")[0]}
    rows = []
    for case, (make, nbytes) in make_cases(args.size).items():
        for direction in ("put", "get"):
            seconds = {}
            # Interleaved per platform, same process, same sources.
            for platform, device in devices.items():
                if direction == "put":
                    seconds[platform] = median_seconds(
                        lambda _, d=device: jax.device_put(make(), d).block_until_ready(),
                        args.repeats,
                    )
                else:
                    seconds[platform] = median_seconds(
                        lambda array: np.asarray(array),
                        args.repeats,
                        prepare=lambda d=device: jax.device_put(make(), d).block_until_ready(),
                    )
            rows.append(
                {
                    "case": case,
                    "direction": direction,
                    "bytes": nbytes,
                    "ferry_ms": seconds["ferry"] * 1e3,
                    "wrapped_ms": seconds["wrapped"] * 1e3,
                    "ferry_gbps": nbytes / seconds["ferry"] / 1e9,
                    "wrapped_gbps": nbytes / seconds["wrapped"] / 1e9,
                    "speedup": seconds["wrapped"] / seconds["ferry"],
                }
            )
    header = f"{'case':<15}{'op':<5}{'MiB':>8}{'ferry ms':>11}{'wrapped ms':>12}"
    header += f"{'ferry GB/s':>12}{'wrapped GB/s':>14}{'speedup':>9}"
    print(header)
    for row in rows:
        print(
            f"{row['case']:<15}{row['direction']:<5}{row['bytes'] / 2**20:>8.1f}"
            f"{row['ferry_ms']:>11.2f}{row['wrapped_ms']:>12.2f}{row['ferry_gbps']:>12.2f}"
            f"{row['wrapped_gbps']:>14.2f}{row['speedup']:>8.2f}x"
        )
    print(json.dumps({"bench": "jax_plugin", "size": args.size, "repeats": args.repeats,
                      "wrapped": wrapped, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
