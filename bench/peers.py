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
         With --jax-plugin PATH (ferry-bench --peers on a pjrt device passes its plugin), the
         device is that PJRT plugin's, registered with jax; "jax_device" in the row names it.
  numpy  np.copyto(dst, src, casting="unsafe") into a preallocated dense dst (bfloat16 from
         ml_dtypes).

Sources and preallocated destinations are on 2 MiB-aligned memory advised to use huge pages, as
the C++ cases' HostTensors are, so both sides read and write the same kind of memory; every
destination is written once before timing (no page fault is timed: that favours the peers, whose
destination is reused, over ferry, which allocates its result every run). d2h cases have no
device here: the "device" data is a host array (for torch and numpy) and the peer writes a host
array of the destination dtype.

Each peer runs once untimed (the warm-up, which also checks the result's dtype, shape and a few
values), then --repeats times, the peers taking turns (torch, jax, numpy, torch, ...) with a
pause of PAUSE_SECONDS before each run; the median is reported. With --serve, ferry-bench
--peers drives the turns: one run of every peer after each of ferry's own timed runs (see
serve()). A peer whose module is missing or that raises gets null and "<peer>_error" (the
reason). When jax's result shares the source's memory (device_put of an aligned dense array,
np.asarray of a CPU jax array: zero-copy) the row has "jax_aliased": true: the time then copies
nothing.

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
import sys
import time

import numpy as np

PEERS = ("torch", "jax", "numpy")
# Before each timed peer run: lets the thread pools of what ran before go idle.
PAUSE_SECONDS = 0.05


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


# --jax-plugin: a PJRT plugin library that jax puts onto instead of its own CPU device (ferry-bench
# passes the plugin its pjrt device runs on, so both put onto the same plugin).
JAX_PLUGIN = None
JAX_PLUGIN_PLATFORM = "peer_pjrt"


def jax_device():
    import jax

    if JAX_PLUGIN is None:
        return jax.devices("cpu")[0]
    from jax._src import xla_bridge  # JAX's plugin registry (what jax_plugins packages use)

    if JAX_PLUGIN_PLATFORM not in xla_bridge._backend_factories:
        # A low priority: the plugin is not jax's default backend, only named.
        xla_bridge.register_plugin(JAX_PLUGIN_PLATFORM, priority=-1, library_path=JAX_PLUGIN)
    return jax.devices(JAX_PLUGIN_PLATFORM)[0]


def jax_peer(source, destination_dtype, d2h):
    import jax
    import jax.numpy as jnp

    cpu = jax_device()
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


def time_once(run):
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    del result
    return seconds


class CasePeers:
    """One case's source and its peers, built, warmed up and checked: run_once() times every
    peer's every method once; finish() gives the case's row (each peer's best method by
    median)."""

    def __init__(self, name, size):
        if name not in CASES:
            raise ValueError(f"unknown case {name!r}")
        self.row = {"case": name, "versions": versions()}
        self.methods = {}  # peer -> [(method, run, aliased)]
        self.times = {}  # (peer, method) -> [seconds]
        try:
            self.source, self.destination_dtype = CASES[name](size)
        except Exception as error:  # noqa: BLE001 - e.g. no ml_dtypes for bfloat16
            reason = f"{type(error).__name__}: {error}"
            for peer in PEERS:
                self.row[f"{peer}_seconds_median"] = None
                self.row[f"{peer}_error"] = f"cannot build the source: {reason}"
            self.source = None
            return
        self.row["source_dtype"] = str(self.source.dtype)
        self.row["destination_dtype"] = str(self.destination_dtype)
        self.row["dims"] = list(self.source.shape)
        self.row["source_byte_strides"] = list(self.source.strides)
        for peer in PEERS:
            self._prepare(peer, name.startswith("d2h"))

    def _prepare(self, peer, d2h):
        """Builds the peer's methods and runs each once untimed (the warm-up and the check)."""
        self.row[f"{peer}_seconds_median"] = None
        try:
            if peer == "torch":
                methods, device_source = torch_peer(self.source, self.destination_dtype)
            elif peer == "jax":
                methods, device_source = jax_peer(self.source, self.destination_dtype, d2h)
            else:
                methods, device_source = numpy_peer(self.source, self.destination_dtype)
            source_address = buffer_address(
                device_source if device_source is not None else self.source)
            checked = []
            for method, run in methods:
                result = run()
                check(result, self.source, self.destination_dtype)
                checked.append((method, run, buffer_address(result) == source_address))
                del result
            self.methods[peer] = checked
        except Exception as error:  # noqa: BLE001 - the reason is the result
            self.row[f"{peer}_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]

    def run_once(self):
        """Times each method of each peer once. A pause comes before each peer, so that the
        thread pools of what ran before (the last peer, or ferry in --serve) have gone idle."""
        for peer, methods in list(self.methods.items()):
            try:
                for method, run, _ in methods:
                    time.sleep(PAUSE_SECONDS)
                    self.times.setdefault((peer, method), []).append(time_once(run))
            except Exception as error:  # noqa: BLE001 - the reason is the result
                self.row[f"{peer}_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
                del self.methods[peer]
        time.sleep(PAUSE_SECONDS)

    def finish(self):
        """The case's row; drops the source and the peers' buffers."""
        for peer, methods in self.methods.items():
            best = None
            for method, _, aliased in methods:
                times = self.times.get((peer, method), [])
                if not times:
                    continue
                median = statistics.median(times)
                if best is None or median < best[1]:
                    best = (method, median, times, aliased)
            if best is None:
                self.row[f"{peer}_error"] = "never timed"
                continue
            method, median, times, aliased = best
            self.row[f"{peer}_seconds_median"] = median
            self.row[f"{peer}_seconds_all"] = times
            self.row[f"{peer}_method"] = method
            if peer == "jax":
                self.row["jax_aliased"] = aliased
                self.row["jax_device"] = JAX_PLUGIN or "jax's cpu device"
        self.methods = {}
        self.source = None
        return self.row


def versions():
    found = {"numpy": np.__version__}
    for name in ("torch", "jax", "ml_dtypes"):
        try:
            found[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - absent is an answer
            found[name] = None
    return found


def serve(size):
    """--serve: one JSON command per line on stdin, one JSON reply per line on stdout.
      {"op": "prepare", "case": NAME}  builds the case's peers -> {"ok": true}
      {"op": "run"}                     times each peer once   -> {"ok": true}
      {"op": "finish"}                  the case's row, as the one-shot mode prints it
    ferry-bench --peers drives it, one "run" after each of ferry's timed runs, so that ferry and
    its peers are timed turn by turn under the same conditions of the machine. Replies go to the
    original stdout alone: whatever a library prints there goes to stderr instead."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    case = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command.get("op")
        try:
            if op == "prepare":
                case = CasePeers(command["case"], size)
                reply = {"ok": True}
            elif op == "run":
                case.run_once()
                reply = {"ok": True}
            elif op == "finish":
                reply = case.finish()
                case = None
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as error:  # noqa: BLE001 - the driver reports it
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
        print(json.dumps(reply), file=replies, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=float, default=1.0, help="scale of every case's size")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--serve", action="store_true",
                        help="take commands on stdin (ferry-bench --peers drives this)")
    parser.add_argument("--jax-plugin", default=None,
                        help="a PJRT plugin library (.so) jax puts onto instead of its CPU device")
    args = parser.parse_args()
    global JAX_PLUGIN
    JAX_PLUGIN = args.jax_plugin
    if args.serve:
        serve(args.size)
        return
    rows = []
    for name in args.case:
        case = CasePeers(name, args.size)
        for _ in range(args.repeats):
            case.run_once()
        rows.append(case.finish())
        del case
    print(json.dumps({"results": rows}))


if __name__ == "__main__":
    main()
