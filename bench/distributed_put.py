#!/usr/bin/env python3
"""Sharded checkpoint loading by 1, 2 and 4 processes (issue 15's benchmark).

Writes a mixed-dtype sample checkpoint (`ferry sample`, bf16 weights and int64 ids), then for each
process count runs `mpiexec -n N ferry put FILE --mesh all --shard-dim D --drop-page-cache --json`:
each process has its own host device(s) and sends them only its shards, straight from the mapped
file. The page cache is dropped (posix_fadvise DONTNEED) before each run, so the file comes from
the disk. Per rank:

- shards: the bytes of its own shards (split tensors' rows or columns, and every replicated tensor);
- read alone: what it reads with no other rank running (after the timed run, rank by rank: the
  cache dropped, that rank alone maps the file and sends its shards again, then mincore counts
  the file's resident pages). The ranks of one machine share the page cache, so in the timed run a
  page is read once, by whichever rank faults first: "read alone" is what a rank on a machine of
  its own would read. Issue 15's target: at most its shards plus one chunk per tensor;
- anon peak: its largest anonymous resident memory during the put (RssAnon, sampled every 2 ms:
  the heap, the host devices' buffers, staging). Issue 15's memory target (at most its own shards
  plus 64 MiB, never a full tensor it does not own) is measured against this, because it is the
  memory the process owns: the file-backed part of RSS is page cache, clean pages of a read-only
  mapping that the kernel drops under pressure without writing anything and that every process of
  the machine shares; RSS counts them only because they are mapped;
- file peak: its largest file-backed resident memory (RssFile: the mapped pages of the checkpoint,
  its own and those it found in the cache around its own, and the libraries' code); peak RSS
  (VmHWM) is about anon peak + file peak;
- time: from the start barrier to its last shard on its devices; GB/s of its shards.
For the job: the aggregate (the file's bytes over the slowest rank's time), its ratio to the first
process count's (1 process putting the whole file), and the medians over the runs.

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

MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ferry", required=True, help="the ferry command line binary")
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--hidden", type=int, default=0, help="the sample's hidden size (0: chosen)")
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
            sample = [args.ferry, "sample", path, "--size", args.size]
            if args.hidden:
                sample += ["--hidden", str(args.hidden)]
            subprocess.run(sample, check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, FERRY_HOST_DEVICES=str(args.devices_per_process))
        env.pop("COLUMNS", None)
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
        report(args, results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({str(n): runs for n, runs in results.items()}, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(args, results):
    first = results[args.processes[0]][0]
    print(f"file: {first['total_bytes'] / MIB:.1f} MiB, --shard-dim {args.shard_dim}, "
          f"{args.devices_per_process} host device(s) per process, cold cache; per rank: the run "
          f"of median aggregate of {args.repeat}\n")
    print(f"{'procs':>5} {'rank':>4} {'shards':>8} {'read alone':>10} {'excess':>7} "
          f"{'anon peak':>9} {'- shards':>8} {'file peak':>9} {'VmHWM':>7} {'time s':>7} "
          f"{'GB/s':>5}")
    summary = []
    base = None
    for n, runs in results.items():
        ordered = sorted(runs, key=lambda run: run["aggregate_gbps"])
        median = ordered[len(ordered) // 2]
        for rank in median["ranks"]:
            s = rank["seconds"]
            shards = rank["shard_bytes"]
            alone = rank["isolated_read_bytes"]
            anon = rank["peak_anonymous_bytes"]
            print(f"{n:>5} {rank['rank']:>4} {shards / MIB:>8.1f} {alone / MIB:>10.1f} "
                  f"{(alone - shards) / MIB:>7.1f} {anon / MIB:>9.1f} {(anon - shards) / MIB:>8.1f} "
                  f"{rank['peak_file_backed_bytes'] / MIB:>9.1f} {rank['peak_rss_bytes'] / MIB:>7.1f} "
                  f"{s:>7.3f} {shards / s / 1e9 if s else 0:>5.2f}")
        aggregates = [run["aggregate_gbps"] for run in runs]
        aggregate = statistics.median(aggregates)
        base = base or aggregate
        memory_ok = all(r["peak_anonymous_bytes"] <= r["shard_bytes"] + 64 * MIB
                        for run in runs for r in run["ranks"])
        summary.append((n, aggregate, aggregates, aggregate / base, memory_ok,
                        max(r["isolated_read_bytes"] - r["shard_bytes"] for r in median["ranks"])))
    print(f"\n{'procs':>5} {'aggregate GB/s':>14} {'runs':<20} {'vs first':>8} "
          f"{'anon <= shards + 64 MiB':>23} {'most excess read MiB':>20}")
    for n, aggregate, aggregates, ratio, memory_ok, excess in summary:
        runs = " / ".join(f"{a:.2f}" for a in aggregates)
        print(f"{n:>5} {aggregate:>14.2f} {runs:<20} {ratio:>8.2f} "
              f"{'yes, every rank' if memory_ok else 'NO':>23} {excess / MIB:>20.1f}")


if __name__ == "__main__":
    sys.exit(main())
