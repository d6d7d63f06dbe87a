"""A checkpoint into jax.Arrays of another dtype on ferry's platform: ferry.jax.load_file against
what a JAX user writes today, each load in a fresh process (docs/jax.md, "Checkpoints into JAX").

  ferry            ferry.jax.load_file(path, dtype=DTYPE): each tensor read from the mapped file
                   and converted in one pass by ferry, then taken by JAX without another copy.
  flax_on_ferry    safetensors.flax.load_file(path) with "ferry" as JAX's default backend (the
                   arrays land on ferry's device), then .astype(DTYPE) of every floating tensor
                   (run by XLA on the device); nothing left to put.
  flax_then_put    safetensors.flax.load_file(path) on JAX's "cpu" backend, .astype(DTYPE) there,
                   then jax.device_put(..., ferry's device).

Every run is a fresh interpreter that imports ferry and JAX, registers ferry's plugin and starts
the backends before the clock starts: the time is the load alone, to every array ready
(block_until_ready). The file stays in the page cache (one untimed read first). Loaders are
interleaved, `--repeats` runs each; medians, GB/s of the file's bytes, peak RSS of the process.

  python bench/jax_load_file_bench.py --file sample.safetensors [--dtype bfloat16] [--json out]

Make the file with `ferry sample --size 1GiB --dtype float32 sample.safetensors`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import numpy as np
import ferry.jax
loader, path, dtype, wrapped = sys.argv[1:5]
ferry.jax.register(wrapped or None, priority=400 if loader == "flax_on_ferry" else 0)
import jax, jax.numpy as jnp
target = jax.devices("ferry")[0]
jax.devices("cpu")
jax.block_until_ready(jax.device_put(np.ones(4, np.float32), target))  # backends started

def floating(x):
    return jnp.issubdtype(x.dtype, jnp.floating)

start = time.perf_counter()
if loader == "ferry":
    arrays = ferry.jax.load_file(path, dtype=dtype, device=target)
elif loader == "flax_on_ferry":
    import safetensors.flax
    arrays = safetensors.flax.load_file(path)
    arrays = {n: a.astype(dtype) if floating(a) else a for n, a in arrays.items()}
else:
    import safetensors.flax
    with jax.default_device(jax.devices("cpu")[0]):
        arrays = safetensors.flax.load_file(path)
        arrays = {n: a.astype(dtype) if floating(a) else a for n, a in arrays.items()}
    arrays = jax.device_put(arrays, target)
jax.block_until_ready(arrays)
seconds = time.perf_counter() - start
assert all(a.devices() == {target} for a in arrays.values())
dtypes = sorted({str(a.dtype) for a in arrays.values()})
print(json.dumps({"seconds": seconds, "tensors": len(arrays), "dtypes": dtypes,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

LOADERS = ("ferry", "flax_on_ferry", "flax_then_put")


def run_once(loader, path, dtype, wrapped):
    completed = subprocess.run([sys.executable, "-c", CHILD, loader, path, dtype, wrapped or ""],
                               capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"{loader} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True, help="a safetensors file")
    parser.add_argument("--dtype", default="bfloat16", help="the dtype to store (bfloat16)")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per loader (5)")
    parser.add_argument("--wrapped", default=None, help="the plugin ferry wraps (its default)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    with open(args.file, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    size = os.path.getsize(args.file)
    runs = {loader: [] for loader in LOADERS}
    for _ in range(args.repeats):
        for loader in LOADERS:  # interleaved: a busy spell hits every loader alike
            runs[loader].append(run_once(loader, args.file, args.dtype, args.wrapped))

    rows = []
    for loader in LOADERS:
        seconds = [r["seconds"] for r in runs[loader]]
        median = statistics.median(seconds)
        rows.append({"loader": loader, "seconds_median": median, "seconds_all": seconds,
                     "gb_per_s": size / median / 1e9,
                     "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs[loader]),
                     "tensors": runs[loader][0]["tensors"], "dtypes": runs[loader][0]["dtypes"]})
    ferry_median = rows[0]["seconds_median"]
    best_peer = min(row["seconds_median"] for row in rows[1:])
    print(f"{os.path.basename(args.file)}: {size / 2**20:.0f} MiB, {rows[0]['tensors']} tensors, "
          f"into {args.dtype}; medians of {args.repeats} fresh processes")
    print(f"{'loader':<15} {'median s':>9} {'GB/s':>6} {'peak RSS MiB':>13} {'ferry ×':>8}")
    for row in rows:
        speedup = row["seconds_median"] / ferry_median
        print(f"{row['loader']:<15} {row['seconds_median']:>9.3f} {row['gb_per_s']:>6.2f} "
              f"{row['peak_rss_mib']:>13.0f} {speedup:>8.2f}")
    print(f"ferry against the faster peer: {best_peer / ferry_median:.2f}×")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"file": args.file, "bytes": size, "dtype": args.dtype,
                       "repeats": args.repeats, "results": rows,
                       "ferry_speedup_over_best_peer": best_peer / ferry_median}, f, indent=2)


if __name__ == "__main__":
    main()
