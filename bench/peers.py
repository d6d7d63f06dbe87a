"""The peers a user would pick instead of ferry, timed on ferry-bench's transfer cases.

For each case (the same source shape, dtype, byte strides and destination dtype as the C++ case
in bench/ferry_bench.cc builds at the same --size), three peers from PyPI produce the case's
result, a dense array of the destination dtype:

  torch  dst.copy_(src): dst preallocated, dense, in the destination dtype; src the source as a
         torch tensor (torch.from_numpy, then .T, [::2, ::2]), strides and all. With
         torch.set_num_threads(os.cpu_count()) this is torch's fastest strided copy-convert.
  jax    jax.device_put(src) then .astype(dtype), .block_until_ready() (PJRT's own host transfer,
         strides handled by PJRT; the conversion an XLA op on the CPU device), or
         jnp.asarray(src, dtype=dtype), which converts on the host first: the faster of the two
         is reported and named. d2h: the "device" data is a jax array on the CPU device (put
         there untimed); timed is np.asarray(x.astype(dtype)) or np.asarray(x).astype(dtype).
  numpy  np.copyto(dst, src, casting="unsafe") into a preallocated dense dst (bfloat16 from
         ml_dtypes).

Sources and preallocated destinations are on 2 MiB-aligned memory advised to use huge pages, as
the C++ cases' HostTensors are, so both sides read and write the same kind of memory; every
destination is written once before timing (no page fault is timed: that favours the peers, whose
destination is reused, over ferry, which allocates its result every run). d2h cases have no
device here: the "device" data is a host array (for torch and numpy) and the peer writes a host
array of the destination dtype.

Each peer runs once untimed (the warm-up, which also checks the result's dtype, shape and a few
values), then --repeats times; the median is reported. A peer whose module is missing or that
raises gets null and "<peer>_error" (the reason). When jax's result shares the source's memory
(device_put of an aligned dense array, np.asarray of a CPU jax array: zero-copy) the row has
"jax_aliased": true: the time then copies nothing.

Prints {"results": [{"case", "versions", "torch_seconds_median", "torch_seconds_all",
"torch_method" (or "torch_error"), "jax_...", "jax_aliased", "numpy_..."}]} on stdout.
"""

import argparse
import ctypes
import json
import math
import mmap
import os
import statistics
import time

import numpy as np

PEERS = ("torch", "jax", "numpy")


def scaled_count(full, scale, multiple_of=1):
    """ScaledCount of bench/bench_case.h: llround (halves away from zero), then down to a
    multiple."""
    scaled = int(math.floor(full * scale + 0.5))
    return max(multiple_of, scaled // multiple_of * multiple_of)


def huge_page_array(shape, dtype):
    """An array on memory advised to use huge pages and aligned to 2 MiB (py_bench.py's
    huge_page_array, for any shape and dtype)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    huge = 2 << 20
    region = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    offset = (-address) % huge
    flat = np.frombuffer(region, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    return flat.reshape(shape)


def filled(shape, dtype, seed):
    """Non-zero values with varied mantissas (conversions must round), every page written."""
    array = huge_page_array(shape, dtype)
    values = np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)
    array[...] = values.astype(dtype) if np.dtype(dtype).itemsize < 4 else values
    return array


def bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# --- cases: (source view, destination dtype), as bench/ferry_bench.cc prepares them ------------


def case_dense(scale, source_dtype, destination_dtype):
    count = scaled_count((256 << 20) // np.dtype(source_dtype).itemsize, scale, 64)
    return filled((count,), source_dtype, 1), np.dtype(destination_dtype)


def case_transposed(scale):
    side = scaled_count(4096, math.sqrt(scale))
    return filled((side, side), np.float32, 2).T, np.dtype(np.float32)


def case_strided_slice(scale):
    side = scaled_count(8192, math.sqrt(scale), 2)
    return filled((side, side), np.float32, 3)[::2, ::2], np.dtype(np.float32)


def case_d2h(scale, count, device_dtype):
    count = scaled_count(count, scale, 64)
    return filled((count,), device_dtype, 4), np.dtype(np.float32)


CASES = {
    "h2d_contiguous": lambda s: case_dense(s, np.float32, np.float32),
    "h2d_transposed": case_transposed,
    "h2d_strided_slice": case_strided_slice,
    "h2d_convert_f32_bf16": lambda s: case_dense(s, np.float32, bfloat16()),
    "h2d_convert_f64_f32": lambda s: case_dense(s, np.float64, np.float32),
    "h2d_convert_f32_f16": lambda s: case_dense(s, np.float32, np.float16),
    "d2h_contiguous": lambda s: case_d2h(s, (256 << 20) // 4, np.float32),
    "d2h_upcast_bf16_f32": lambda s: case_d2h(s, 64 << 20, bfloat16()),
}


# --- peers: each returns [(method, run)], run() producing the result (untimed setup done) ------


def torch_dtype(torch, dtype):
    if dtype == bfloat16():
        return torch.bfloat16
    return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
            np.dtype(np.float64): torch.float64}[dtype]


def as_torch(torch, array):
    """A torch tensor over `array`'s memory, strides and all (torch.from_numpy has no
    bfloat16: go through uint16)."""
    base = array
    while base.base is not None and isinstance(base.base, np.ndarray):
        base = base.base
    if array.dtype == bfloat16():
        whole = torch.from_numpy(base.view(np.uint16)).view(torch.bfloat16)
    else:
        whole = torch.from_numpy(base)
    offset = (array.ctypes.data - base.ctypes.data) // array.itemsize
    strides = [s // array.itemsize for s in array.strides]
    return whole.as_strided(array.shape, strides, offset)


def torch_peer(source, destination_dtype):
    import torch

    torch.set_num_threads(os.cpu_count())
    destination_array = huge_page_array(source.shape, destination_dtype)
    destination_array[...] = 1
    destination = as_torch(torch, destination_array)
    assert destination.dtype == torch_dtype(torch, destination_dtype)
    src = as_torch(torch, source)

    def run():
        destination.copy_(src)
        return destination_array

    return [("dst.copy_(src)", run)], None


def jax_peer(source, destination_dtype, d2h):
    import jax
    import jax.numpy as jnp

    cpu = jax.devices("cpu")[0]
    if d2h:
        on_device = jax.device_put(source, cpu).block_until_ready()

        def device_convert():
            return np.asarray(on_device.astype(destination_dtype))

        def host_convert():
            return np.asarray(on_device).astype(destination_dtype)

        return [("np.asarray(x.astype(dtype))", device_convert),
                ("np.asarray(x).astype(dtype)", host_convert)], on_device

    def device_put_then_astype():
        return jax.device_put(source, cpu).astype(destination_dtype).block_until_ready()

    def asarray_with_dtype():
        with jax.default_device(cpu):
            return jnp.asarray(source, dtype=destination_dtype).block_until_ready()

    methods = [("device_put(src).astype(dtype)", device_put_then_astype)]
    if source.dtype != destination_dtype:
        methods.append(("jnp.asarray(src, dtype=dtype)", asarray_with_dtype))
    return methods, None


def numpy_peer(source, destination_dtype):
    destination = huge_page_array(source.shape, destination_dtype)
    destination[...] = 1

    def run():
        np.copyto(destination, source, casting="unsafe")
        return destination

    return [("np.copyto(dst, src)", run)], None


def buffer_address(result):
    if isinstance(result, np.ndarray):
        return result.ctypes.data
    return result.unsafe_buffer_pointer()


def check(result, source, destination_dtype):
    """The result is the source in the destination dtype: dtype, shape, and a spread of values."""
    host = np.asarray(result)
    if host.dtype != destination_dtype or host.shape != source.shape:
        raise ValueError(f"made {host.dtype}{list(host.shape)}, want "
                         f"{destination_dtype}{list(source.shape)}")
    flat_source = source.reshape(-1)  # a copy for strided sources: untimed
    flat = host.reshape(-1)
    picks = np.linspace(0, flat.size - 1, num=min(flat.size, 4099)).astype(np.int64)
    want = flat_source[picks].astype(destination_dtype)
    if not np.array_equal(flat[picks].astype(np.float64), want.astype(np.float64)):
        raise ValueError("the result differs from the source")


def time_method(run, repeats):
    result = run()  # warm-up
    del result
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times), times


def measure_peer(row, peer, source, destination_dtype, d2h, repeats):
    row[f"{peer}_seconds_median"] = None
    try:
        if peer == "torch":
            methods, device_source = torch_peer(source, destination_dtype)
        elif peer == "jax":
            methods, device_source = jax_peer(source, destination_dtype, d2h)
        else:
            methods, device_source = numpy_peer(source, destination_dtype)
        source_address = buffer_address(device_source if device_source is not None else source)
        best = None
        for method, run in methods:
            result = run()
            check(result, source, destination_dtype)
            aliased = buffer_address(result) == source_address
            del result
            median, times = time_method(run, repeats)
            if best is None or median < best[1]:
                best = (method, median, times, aliased)
            time.sleep(0.2)  # let the thread pools of the last peer go idle
        method, median, times, aliased = best
        row[f"{peer}_seconds_median"] = median
        row[f"{peer}_seconds_all"] = times
        row[f"{peer}_method"] = method
        if peer == "jax":
            row["jax_aliased"] = aliased
    except Exception as error:  # noqa: BLE001 - the reason is the result
        row[f"{peer}_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]


def versions():
    found = {"numpy": np.__version__}
    for name in ("torch", "jax", "ml_dtypes"):
        try:
            found[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - absent is an answer
            found[name] = None
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=float, default=1.0, help="scale of every case's size")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    rows = []
    found = versions()
    for name in args.case:
        row = {"case": name, "versions": found}
        try:
            source, destination_dtype = CASES[name](args.size)
        except Exception as error:  # noqa: BLE001 - e.g. no ml_dtypes for bfloat16
            reason = f"{type(error).__name__}: {error}"
            for peer in PEERS:
                row[f"{peer}_seconds_median"] = None
                row[f"{peer}_error"] = f"cannot build the source: {reason}"
            rows.append(row)
            continue
        row["source_dtype"] = str(source.dtype)
        row["destination_dtype"] = str(destination_dtype)
        row["dims"] = list(source.shape)
        row["source_byte_strides"] = list(source.strides)
        for peer in PEERS:
            measure_peer(row, peer, source, destination_dtype, name.startswith("d2h"),
                         args.repeats)
        del source
        rows.append(row)
    print(json.dumps({"results": rows}))


if __name__ == "__main__":
    main()
