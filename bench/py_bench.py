"""Python-layer cases of ferry-bench: what the `ferry` package adds on top of the C++ transfer.

py_put_small: device_put of 4 KiB numpy arrays (calls/s; single calls and the batched list form).
py_put_large: device_put of a 256 MiB numpy array (on huge pages, like the C++ cases' sources),
against a memcpy (numpy copyto) of the same bytes measured in the same run. Prints JSON rows in ferry-bench's format on stdout.
"""

import argparse
import ctypes
import json
import mmap
import statistics
import time

import numpy as np

import ferry


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def huge_page_array(nbytes):
    """A float32 array on memory advised to use huge pages and aligned to 2 MiB, like the
    HostTensor sources of the C++ cases: both sides then read the same kind of memory (with 4 KiB
    pages, TLB misses on the source alone cost about a third of the transfer time here)."""
    huge = 2 << 20
    region = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = (-address) % huge
    return np.frombuffer(region, dtype=np.float32, count=nbytes // 4, offset=offset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=float, default=1.0, help="scale of every case's size")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="host:0")
    args = parser.parse_args()
    device = ferry.device(args.device)
    rows = []

    # Small puts: 4 KiB float32 arrays, one call each, and the same arrays as one list.
    count = max(16, int(16384 * args.size))
    small = [np.full(1024, i, dtype=np.float32) for i in range(count)]
    keep = []

    def single_puts():
        keep.clear()
        for x in small:
            keep.append(ferry.device_put(x, device))

    def batched_put():
        keep.clear()
        keep.extend(ferry.device_put(small, device))

    single = median_seconds(single_puts, args.repeats)
    batched = median_seconds(batched_put, args.repeats)
    keep.clear()
    small_bytes = count * 4096
    rows.append({
        "case": "py_put_small", "bytes": small_bytes, "seconds_median": single,
        "gbps": small_bytes / single / 1e9, "calls_per_second": count / single,
        "seconds_per_call": single / count,
        "batched_seconds_median": batched, "batched_tensors_per_second": count / batched,
    })

    # One large put, against numpy's copy of the same bytes into touched memory.
    elements = int((256 << 20) * args.size) // 4
    large = huge_page_array(elements * 4)
    large[:] = np.random.default_rng(0).standard_normal(elements, dtype=np.float32)
    destination = np.empty_like(large)
    destination.fill(1)
    memcpy = median_seconds(lambda: np.copyto(destination, large), args.repeats)
    holder = []

    def large_put():
        holder.clear()
        holder.append(ferry.device_put(large, device))

    put = median_seconds(large_put, args.repeats)
    holder.clear()
    rows.append({
        "case": "py_put_large", "bytes": large.nbytes, "seconds_median": put,
        "gbps": large.nbytes / put / 1e9, "vs_memcpy": memcpy / put,
    })
    print(json.dumps({"results": rows}))


if __name__ == "__main__":
    main()
