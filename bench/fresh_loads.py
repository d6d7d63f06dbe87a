"""Checkpoint loads in fresh processes: ferry against the loaders people pick, warm and cold.

Each run is a new Python process (`fresh_loads.py --child LOADER FILE`) that imports its loader,
then loads every tensor of the file into memory it owns, as torch tensors, the way a user of that
loader does:

  ferry            ferry.load_file(path, "host:0") and torch.from_dlpack of each array
  ferry_put        the `ferry put PATH` command (host:0): its own process, timed from outside
  safetensors      safetensors' safe_open(framework="pt"), get_tensor() and .clone() of each
                   (get_tensor alone maps the file and reads nothing until a page is touched)
  fastsafetensors  SafeTensorsFileLoader(device="cpu", nogds=True), copy_files_to_device() and
                   get_tensor() of each (the tensors own their memory)
  tensorizer       TensorDeserializer(path, device="cpu") of the same tensors serialized once
                   (untimed) in tensorizer's own format
  runai            runai-model-streamer's SafetensorsStreamer.stream_file(path, owned=True)
                   and every tensor of get_tensors()

Two yardsticks, not loaders, bound what any loader that puts the bytes into fresh memory of its
own can do on this machine:

  read_floor       the whole file read with pread into one fresh anonymous mapping, 8 MiB reads
                   from one thread per core (warm: the kernel's page-cache copy plus the first
                   touch of every fresh page; cold: buffered reads, that many in flight)
  direct_floor     cold only: the same with O_DIRECT, 32 reads of 1 MiB in flight (the disk's
                   rate without the page cache)
  prefault_floor   read_floor with each read's fresh pages faulted in first, one
                   madvise(MADV_POPULATE_WRITE) a read (Linux 5.14), as ferry's loads do: the
                   bytes into fresh memory without a page fault per 4 KiB inside pread

Loaders are interleaved (round r runs each loader once, in a rotated order) so that a change of
the machine's load falls on all of them. `warm`: the file in the page cache (one untimed run of
each loader first). `cold`: the file dropped from the page cache before each run
(posix_fadvise(POSIX_FADV_DONTNEED); its resident bytes are checked with mincore and reported).
Each run reports the load's own time (`seconds`: in the child, after its imports) and the whole
process's wall time and peak RSS (wait4's ru_maxrss). The table gives medians and the ratio of the
fastest other loader's median to ferry's (`ferry vs best peer`: above 1 means ferry is faster).

The files (made once, in --data-dir, by the `ferry` command and safetensors):
  sample_1g   `ferry sample --size 1GiB` (82 tensors, bf16/f16/f32)
  mixed_2g    `ferry sample --size 2GiB` (bf16/f16/f32, 2 GiB)
  many_20k    20,000 float32 tensors of 64 elements (safetensors.numpy.save_file)

Prints the table on stderr and, with --json PATH (- for stdout), {"results": [...]} with every run.
"""

import argparse
import ctypes
import ctypes.util
import errno
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys

from bench_json import write_document
import time

LOADERS = ["ferry", "ferry_put", "safetensors", "fastsafetensors", "tensorizer", "runai",
           "read_floor", "direct_floor", "prefault_floor"]
PEERS = ["fastsafetensors", "tensorizer", "runai"]  # the done-when's peers (issue 24)
# Yardsticks: bytes into fresh memory, nothing else.
FLOORS = ["read_floor", "direct_floor", "prefault_floor"]
FILES = ["sample_1g", "mixed_2g", "many_20k"]


# --- the loaders, run in the child --------------------------------------------------------------

def load_ferry(path):
    import ferry
    import torch

    return {name: torch.from_dlpack(array) for name, array in ferry.load_file(path, "host:0").items()}


def load_safetensors(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name).clone() for name in f.keys()}


def load_fastsafetensors(path):
    from fastsafetensors import SafeTensorsFileLoader

    loader = SafeTensorsFileLoader(None, "cpu", nogds=True)
    try:
        loader.add_filenames({0: [path]})
        buffer = loader.copy_files_to_device()
        try:
            return {name: buffer.get_tensor(name) for name in buffer.key_to_rank_lidx}
        finally:
            buffer.close()
    finally:
        loader.close()


def load_tensorizer(path):
    from tensorizer import TensorDeserializer

    with TensorDeserializer(tensorizer_path(path), device="cpu") as tensors:
        return dict(tensors.items())


def load_runai(path):
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_file(path, owned=True)
        return dict(streamer.get_tensors())


MADV_POPULATE_WRITE = 23  # Linux 5.14; older kernels refuse it (EINVAL) and nothing is faulted


def read_into_fresh_memory(path, direct, threads, read_bytes, prefault=False):
    """Every byte of `path` into one fresh anonymous mapping (page-aligned, as O_DIRECT needs),
    `threads` preads of `read_bytes` in flight, each read's pages faulted in first with
    `prefault`; returns the mapping as one uint8 tensor."""
    import mmap as mmap_module
    from concurrent.futures import ThreadPoolExecutor

    import torch

    size = os.path.getsize(path)
    page = mmap_module.PAGESIZE
    # Private: mmap's default for anonymous memory is MAP_SHARED, shared memory (tmpfs) pages.
    memory = mmap_module.mmap(-1, (size + page - 1) // page * page or page,
                              flags=mmap_module.MAP_PRIVATE | mmap_module.MAP_ANONYMOUS)
    view = memoryview(memory)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        def read(offset):
            end = min(offset + read_bytes, len(view))
            if prefault:  # read_bytes is a multiple of the page size: offset is page-aligned
                if libc.madvise(ctypes.c_void_p(base + offset), ctypes.c_size_t(end - offset),
                                MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() != errno.EINVAL:
                    raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE) failed")
            while offset < end:  # O_DIRECT reads whole pages: the last one may end past the file
                got = os.preadv(fd, [view[offset:end]], offset)
                if got == 0:
                    break
                offset += got

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(0, size, read_bytes)))
    finally:
        os.close(fd)
    return {"bytes": torch.frombuffer(memory, dtype=torch.uint8, count=size)}


def load_read_floor(path):
    return read_into_fresh_memory(path, direct=False, threads=os.cpu_count(), read_bytes=8 << 20)


def load_direct_floor(path):
    return read_into_fresh_memory(path, direct=True, threads=32, read_bytes=1 << 20)


def load_prefault_floor(path):
    return read_into_fresh_memory(path, direct=False, threads=os.cpu_count(), read_bytes=8 << 20,
                                  prefault=True)


CHILD_LOADERS = {"ferry": load_ferry, "safetensors": load_safetensors,
                 "fastsafetensors": load_fastsafetensors, "tensorizer": load_tensorizer,
                 "runai": load_runai, "read_floor": load_read_floor,
                 "direct_floor": load_direct_floor, "prefault_floor": load_prefault_floor}
IMPORTS = {"ferry": ["torch", "ferry"], "safetensors": ["torch", "safetensors"],
           "fastsafetensors": ["torch", "fastsafetensors"], "tensorizer": ["torch", "tensorizer"],
           "runai": ["torch", "runai_model_streamer"], "read_floor": ["torch"],
           "direct_floor": ["torch"], "prefault_floor": ["torch"]}


def run_child(loader, path):
    import importlib

    for module in IMPORTS[loader]:
        importlib.import_module(module)
    start = time.perf_counter()
    tensors = CHILD_LOADERS[loader](path)
    seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    print(json.dumps({"seconds": seconds, "bytes": nbytes, "tensors": len(tensors)}))


# --- the parent ---------------------------------------------------------------------------------

def tensorizer_path(path):
    return path + ".tensors"


def resident_bytes(path):
    """Bytes of `path` in the page cache (mincore over a read-only mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    with open(path, "rb") as f:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            pages = (size + page - 1) // page
            vector = ctypes.create_string_buffer(pages)
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vector.raw) * page
        finally:
            libc.munmap(ctypes.c_void_p(address), size)


def drop_from_page_cache(path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def loader_file(loader, path):
    return tensorizer_path(path) if loader == "tensorizer" else path


def run_once(args, loader, path, cold):
    if (loader, path) in UNAVAILABLE:
        return {"loader": loader, "cold": cold, "error": UNAVAILABLE[(loader, path)]}
    if loader == "direct_floor" and not cold:
        return {"loader": loader, "cold": cold, "error": "cold only (O_DIRECT skips the page cache)"}
    source = loader_file(loader, path)
    if cold:
        drop_from_page_cache(source)
    resident = resident_bytes(source)
    if loader == "ferry_put":
        command = [args.ferry, "put", "--json", os.devnull, path]
    else:
        command = [args.python, os.path.abspath(__file__), "--child", loader, path]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = process.communicate()
    wall = time.perf_counter() - start
    usage = resource_usage_of(process)
    run = {"loader": loader, "cold": cold, "resident_before": resident, "process_seconds": wall,
           "peak_rss_bytes": usage * 1024 if usage else None, "error": None}
    if process.returncode != 0:
        run["error"] = (err.decode(errors="replace").strip().splitlines() or ["?"])[-1]
        return run
    if loader == "ferry_put":
        run.update(seconds=wall, bytes=os.path.getsize(path), tensors=None)
    else:
        run.update(json.loads(out.decode().strip().splitlines()[-1]))
    return run


_RUSAGE = {}


def resource_usage_of(process):
    return _RUSAGE.pop(process.pid, None)


def _install_wait4_hook():
    """subprocess reaps its children with waitpid; take wait4's rusage instead (peak RSS of that
    child alone, where RUSAGE_CHILDREN would give the largest child so far)."""
    original = subprocess.Popen._try_wait

    def try_wait(self, wait_flags):
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return original(self, wait_flags)
        if pid == self.pid:
            _RUSAGE[pid] = usage.ru_maxrss
        return pid, status

    subprocess.Popen._try_wait = try_wait


def make_files(args):
    os.makedirs(args.data_dir, exist_ok=True)
    paths = {name: os.path.join(args.data_dir, name + ".safetensors") for name in FILES}
    made = {"sample_1g": ["--size", "1GiB"], "mixed_2g": ["--size", "2GiB"]}
    for name, options in made.items():
        if name in args.files and not os.path.exists(paths[name]):
            print(f"fresh_loads: making {paths[name]}", file=sys.stderr)
            subprocess.run([args.ferry, "sample", *options, paths[name]], check=True,
                           stdout=subprocess.DEVNULL)
    if "many_20k" in args.files and not os.path.exists(paths["many_20k"]):
        import numpy as np
        import safetensors.numpy

        rng = np.random.default_rng(20000)
        safetensors.numpy.save_file(
            {f"layer{i // 100}.w{i % 100}": rng.standard_normal(64).astype(np.float32)
             for i in range(20000)}, paths["many_20k"])
    if "tensorizer" in args.loaders:
        for name in args.files:
            if not os.path.exists(tensorizer_path(paths[name])):
                print(f"fresh_loads: serializing {name} for tensorizer", file=sys.stderr)
                made = subprocess.run([args.python, "-c", SERIALIZE, paths[name]],
                                      capture_output=True, text=True)
                if made.returncode != 0:  # 20,000 tensors: tensorizer's "Metadata overflow"
                    reason = (made.stderr.strip().splitlines() or ["?"])[-1]
                    UNAVAILABLE[("tensorizer", paths[name])] = f"cannot serialize: {reason}"
                    if os.path.exists(tensorizer_path(paths[name])):
                        os.remove(tensorizer_path(paths[name]))
    return {name: paths[name] for name in args.files}


UNAVAILABLE = {}  # (loader, path) -> why that loader cannot load that file


SERIALIZE = """
import sys, safetensors.torch
from tensorizer import TensorSerializer
tensors = safetensors.torch.load_file(sys.argv[1])
serializer = TensorSerializer(sys.argv[1] + ".tensors")
serializer.write_state_dict(tensors)
serializer.close()
"""


def summarize(runs, loader, file, cold):
    chosen = [r for r in runs if r["loader"] == loader and r["file"] == file and r["cold"] == cold]
    good = [r for r in chosen if r["error"] is None]
    if not good:
        return {"loader": loader, "file": file, "cache": "cold" if cold else "warm",
                "error": chosen[0]["error"] if chosen else "not run"}
    seconds = statistics.median(r["seconds"] for r in good)
    return {"loader": loader, "file": file, "cache": "cold" if cold else "warm",
            "seconds_median": seconds, "seconds_all": [r["seconds"] for r in good],
            "process_seconds_median": statistics.median(r["process_seconds"] for r in good),
            "gbps": good[0]["bytes"] / seconds / 1e9,
            "peak_rss_bytes_median": statistics.median(r["peak_rss_bytes"] for r in good),
            "resident_before_max": max(r["resident_before"] for r in good), "error": None}


def print_table(rows):
    out = sys.stderr
    line = f"{'file':<10} {'cache':<5} {'loader':<16} {'median s':>9} {'GB/s':>6} {'process s':>9}"
    print(line + f" {'peak RSS':>9}", file=out)
    for row in rows:
        head = f"{row['file']:<10} {row['cache']:<5} {row['loader']:<16}"
        if row["error"]:
            print(f"{head} error: {row['error'][:60]}", file=out)
            continue
        print(f"{head} {row['seconds_median']:>9.3f} {row['gbps']:>6.2f} "
              f"{row['process_seconds_median']:>9.3f} "
              f"{row['peak_rss_bytes_median'] / 2**20:>5.0f} MiB", file=out)
        if "vs_best_peer" in row:
            print(f"{'':<33} ferry vs best peer ({row['best_peer']}): "
                  f"{row['vs_best_peer']:.2f}x time, {row['rss_vs_best_peer_rss']:.2f}x RSS of "
                  f"the lowest peer", file=out)
        if "vs_safetensors" in row:
            print(f"{'':<33} ferry vs safetensors: {row['vs_safetensors']:.2f}x time", file=out)
        if "floor" in row:
            print(f"{'':<33} {row['floor']} {row['floor_seconds']:.3f} s: ferry at "
                  f"{row['ferry_vs_floor']:.2f}x its speed; the best peer is "
                  f"{row['best_peer_over_floor']:.2f}x its time", file=out)


def add_ratios(rows):
    """ferry's rows: vs_best_peer (the fastest of PEERS' median over ferry's), the RSS over the
    lowest peer's, vs_safetensors, and against the fastest floor (FLOORS): ferry_vs_floor (the
    floor's median over ferry's) and best_peer_over_floor (the fastest peer's median over the
    floor's: the most that any loader into fresh memory could be ahead of that peer)."""
    for row in rows:
        if row["loader"] != "ferry" or row["error"]:
            continue
        same = [r for r in rows if r["file"] == row["file"] and r["cache"] == row["cache"]
                and not r["error"]]
        peers = [r for r in same if r["loader"] in PEERS]
        if peers:
            best = min(peers, key=lambda r: r["seconds_median"])
            row["best_peer"] = best["loader"]
            row["vs_best_peer"] = best["seconds_median"] / row["seconds_median"]
            row["rss_vs_best_peer_rss"] = (row["peak_rss_bytes_median"]
                                           / min(r["peak_rss_bytes_median"] for r in peers))
        floors = [r for r in same if r["loader"] in FLOORS]
        if floors:
            floor = min(floors, key=lambda r: r["seconds_median"])
            row["floor"] = floor["loader"]
            row["floor_seconds"] = floor["seconds_median"]
            row["ferry_vs_floor"] = floor["seconds_median"] / row["seconds_median"]
            if peers:
                row["best_peer_over_floor"] = best["seconds_median"] / floor["seconds_median"]
        safetensors = [r for r in same if r["loader"] == "safetensors"]
        if safetensors:
            row["vs_safetensors"] = safetensors[0]["seconds_median"] / row["seconds_median"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("LOADER", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("--cache", default="warm,cold", help="warm, cold or both")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per loader")
    parser.add_argument("--data-dir", default="/tmp/ferry-fresh-loads")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--ferry", default=shutil.which("ferry") or "ferry")
    parser.add_argument("--json", help="write every run and the medians here (- for stdout)")
    args = parser.parse_args()
    if args.child:
        run_child(*args.child)
        return
    args.loaders = args.loaders.split(",")
    args.files = args.files.split(",")
    unknown = set(args.loaders) - set(LOADERS) | set(args.files) - set(FILES)
    if unknown:
        parser.error(f"unknown loader or file: {', '.join(sorted(unknown))}")
    _install_wait4_hook()
    paths = make_files(args)
    runs = []
    for cache in args.cache.split(","):
        cold = cache == "cold"
        for file, path in paths.items():
            if not cold:
                for loader in args.loaders:  # the page cache filled, every loader's code warm
                    run_once(args, loader, path, cold=False)
            for repeat in range(args.repeats):
                shift = repeat % len(args.loaders)
                for loader in args.loaders[shift:] + args.loaders[:shift]:
                    run = run_once(args, loader, path, cold)
                    run["file"] = file
                    runs.append(run)
                    print(f"fresh_loads: {file} {cache} {loader} "
                          f"{run.get('seconds') or 0:.3f} s", file=sys.stderr, flush=True)
    rows = [summarize(runs, loader, file, cold == "cold")
            for cold in args.cache.split(",") for file in paths for loader in args.loaders]
    add_ratios(rows)
    print_table(rows)
    document = {"results": rows, "runs": runs,
                "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()}}
    write_document(document, args.json)


if __name__ == "__main__":
    main()
