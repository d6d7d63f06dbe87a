"""A fresh process's first transfers, with fresh pages faulted in ahead and without.

Each run is a new Python process (`fresh_transfers.py --child DEVICE`) that makes a 256 MiB
float32 array (8192x8192) and times, once each, the process's first transfers, whose destinations
are memory nobody has written yet (ferry's host memory cache is still empty):

  put         ferry.device_put(x, device), until ready
  put_t       ferry.device_put(x.T, device): the transpose, written tile by tile
  get         ferry.device_get of the first put: into the new host array ferry allocates

`on` runs with FERRY_HOST_PREFAULT=on (the default: each MiB of a large destination that holds a
page not yet resident is faulted in with one madvise(MADV_POPULATE_WRITE) before it is written,
include/ferry/core/prefault.h); `off` with FERRY_HOST_PREFAULT=off (a page fault per 4 KiB page
inside the copy). The two alternate run by run, so that a change of the machine falls on both.
Prints medians and the ratio off / on per device on stderr; --json PATH (- for stdout) writes
{"results": [...]} with every run.

Usage: python bench/fresh_transfers.py [--devices host:0,pjrt:0] [--repeats 5] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_json import write_document

OPERATIONS = ["put", "put_t", "get"]

CHILD = r'''
import json, sys, time
import numpy as np
import ferry
device = ferry.device(sys.argv[1])
x = np.random.default_rng(0).standard_normal((8192, 8192), dtype=np.float32)
seconds = {}
start = time.perf_counter()
on = ferry.device_put(x, device).block_until_ready()
seconds["put"] = time.perf_counter() - start
start = time.perf_counter()
on_t = ferry.device_put(x.T, device).block_until_ready()  # kept: its memory is not reused below
seconds["put_t"] = time.perf_counter() - start
start = time.perf_counter()
back = ferry.device_get(on)
seconds["get"] = time.perf_counter() - start
assert np.array_equal(back, x)
print(json.dumps({"seconds": seconds,
                  "prefaulted_bytes": ferry.metrics().get("HostBytesPrefaulted", 0)}))
'''


def run_child(python, device, prefault):
    env = dict(os.environ, FERRY_HOST_PREFAULT=prefault)
    out = subprocess.run([python, "-c", CHILD, device], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"fresh_transfers: {device} with FERRY_HOST_PREFAULT={prefault} failed:\n"
                         + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="host:0,pjrt:0")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per setting")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json")
    args = parser.parse_args()
    runs = []
    for device in args.devices.split(","):
        for repeat in range(args.repeats):
            for prefault in (["on", "off"] if repeat % 2 == 0 else ["off", "on"]):
                result = run_child(args.python, device, prefault)
                runs.append({"device": device, "prefault": prefault, **result})
                print(f"fresh_transfers: {device} prefault {prefault}: " + " ".join(
                    f"{op} {result['seconds'][op] * 1e3:.1f} ms" for op in OPERATIONS),
                      file=sys.stderr)
    out = sys.stderr
    print(f"{'device':<8} {'operation':<10} {'off (ms)':>10} {'on (ms)':>10} {'off / on':>9}",
          file=out)
    medians = []
    for device in args.devices.split(","):
        for op in OPERATIONS:
            median = {
                prefault: statistics.median(run["seconds"][op] for run in runs
                                            if run["device"] == device
                                            and run["prefault"] == prefault)
                for prefault in ("off", "on")}
            ratio = median["off"] / median["on"]
            medians.append({"device": device, "operation": op, "off_seconds": median["off"],
                            "on_seconds": median["on"], "off_over_on": ratio})
            print(f"{device:<8} {op:<10} {median['off'] * 1e3:>10.1f} {median['on'] * 1e3:>10.1f} "
                  f"{ratio:>8.2f}x", file=out)
    write_document({"results": runs, "medians": medians}, args.json)


if __name__ == "__main__":
    main()
