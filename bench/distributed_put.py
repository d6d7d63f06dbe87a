#!/usr/bin/env python3
"""Sharded checkpoint loading by 1, 2 and 4 processes (issue 15's benchmark).

Writes a mixed-dtype sample checkpoint (`ferry sample`, bf16 weights and int64 ids), then for each
process count runs `mpiexec -n N ferry put FILE --mesh all --shard-dim D --drop-page-cache --json`:
each process has its own host device(s) and sends them only its shards, straight from the mapped
file. The page cache is dropped (posix_fadvise DONTNEED) before each run, so what the processes
read comes from the disk; per rank it reports the bytes of its shards, the bytes it read from
storage (/proc/self/io read_bytes: its own page-cache misses, read-ahead included; a page another
rank already brought in is not counted again), what it reads alone ("alone": rank by rank, the
cache dropped, that rank sending its shards again, the file's resident bytes by mincore), its peak RSS (mapped file pages it touched count
too), its anonymous RSS at the end (the devices' copies and the heap) and time; for the job, the aggregate throughput and the file's resident bytes afterwards
(mincore: the union of what every rank read).

Usage: bench/distributed_put.py --ferry build/plain/ferry [--size 1GiB] [--processes 1 2 4]
       [--shard-dim 0] [--devices-per-process 1] [--repeat 3] [--json results.json]
Not run in CI (tests/tools/cli_distributed_test.sh runs the same measurement on 3 MiB).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ferry", required=True, help="the ferry command line binary")
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--shard-dim", type=int, default=0)
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs per process count (median)")
    parser.add_argument("--file", help="use this checkpoint instead of writing a sample")
    parser.add_argument("--json", help="write every run's numbers here")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="ferry_distributed_bench_", dir=os.getcwd())
    try:
        path = args.file or os.path.join(work, "sample.safetensors")
        if not args.file:
            subprocess.run([args.ferry, "sample", path, "--size", args.size], check=True,
                           stdout=subprocess.DEVNULL)
        env = dict(os.environ, FERRY_HOST_DEVICES=str(args.devices_per_process))
        results = {}
        for n in args.processes:
            runs = []
            for r in range(args.repeat):
                out = os.path.join(work, f"{n}_{r}.json")
                subprocess.run([args.mpiexec, "-n", str(n), args.ferry, "put", path, "--mesh", "all",
                                "--shard-dim", str(args.shard_dim), "--drop-page-cache",
                                "--json", out], check=True, stdout=subprocess.DEVNULL, env=env)
                with open(out) as f:
                    runs.append(json.load(f))
            results[n] = runs
        total = results[args.processes[0]][0]["total_bytes"]
        print(f"file: {total / 2**30:.2f} GiB, --shard-dim {args.shard_dim}, "
              f"{args.devices_per_process} host device(s) per process, median of {args.repeat} "
              "cold-cache runs\n")
        print(f"{'procs':>5} {'rank':>4} {'shard MiB':>10} {'read MiB':>9} {'alone MiB':>10} "
              f"{'peak RSS MiB':>12} {'anon MiB':>9} {'time s':>7} {'GB/s':>6}")
        base = None
        summary = []
        for n, runs in results.items():
            median = sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2]
            for rank in median["ranks"]:
                s = rank["seconds"]
                print(f"{n:>5} {rank['rank']:>4} {rank['shard_bytes'] / 2**20:>10.1f} "
                      f"{rank['storage_read_bytes'] / 2**20:>9.1f} "
                      f"{rank['isolated_read_bytes'] / 2**20:>10.1f} "
                      f"{rank['peak_rss_bytes'] / 2**20:>12.1f} "
                      f"{rank['anonymous_rss_bytes'] / 2**20:>9.1f} {s:>7.3f} "
                      f"{rank['shard_bytes'] / s / 1e9 if s else 0:>6.2f}")
            aggregate = statistics.median(run["aggregate_gbps"] for run in runs)
            base = base or aggregate
            summary.append((n, aggregate, aggregate / base, median["resident_bytes_after"]))
        print(f"\n{'procs':>5} {'aggregate GB/s':>15} {'vs 1st':>7} {'resident after MiB':>19}")
        for n, aggregate, ratio, resident in summary:
            print(f"{n:>5} {aggregate:>15.2f} {ratio:>7.2f} {resident / 2**20:>19.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({str(n): runs for n, runs in results.items()}, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
