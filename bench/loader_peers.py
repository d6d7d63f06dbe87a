"""The real loaders from PyPI on a file of ferry-bench's file cases (bench/file_put_cases.cc).

Each loader produces every tensor of the file in memory the caller owns, as ferry's put does:

  safetensors_numpy  safetensors.numpy.load_file(path): a dict of numpy arrays (copies).
  safetensors_pt     safe_open(path, framework="pt"), get_tensor() of every key and .clone() of
                     each tensor.
  torch_load         the same tensors saved once by torch.save (untimed), then
                     torch.load(path, mmap=True, weights_only=True) and .clone() of every tensor.
  safetensors_open   (--parse-only, for file_parse_many_tensors) safe_open(path) and keys(): the
                     package's own header parse and validation, nothing read.

get_tensor() of safe_open(framework="pt") and torch.load(mmap=True) return tensors that are views
of a private mapping of the file: nothing is read until a page is touched, so without a copy they
would be timed doing no loading at all. The clone reads every tensor into memory the caller owns,
which is what a loader has to deliver and what ferry's put delivers (its own device memory).
safetensors_pt_lazy (get_tensor() alone) is reported for information, and never compared with.

Each is timed `--repeats` times after one untimed warm-up (which also warms the page cache for the
torch file); the previous result is freed before each run, outside the timing. Prints
{"results": [{"loader", "seconds_median", "seconds_all", "bytes", "tensors", "error"}, ...]} on
stdout; a loader that cannot read the file (safetensors.numpy has no bfloat16) has "error" set to
the reason and no times.
"""

import argparse
import gc
import json
import os
import statistics
import time


def load_safetensors_numpy(path):
    import safetensors.numpy

    return safetensors.numpy.load_file(path)


def load_safetensors_pt(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name).clone() for name in f.keys()}


def open_safetensors(path):
    """safe_open alone: the header read, parsed and validated, the file mapped; no tensor read."""
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        return {name: None for name in f.keys()}


def load_safetensors_pt_lazy(path):
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def load_torch(path):
    import torch

    mapped = torch.load(path, mmap=True, weights_only=True)
    return {name: tensor.clone() for name, tensor in mapped.items()}


def nbytes(tensors):
    total = 0
    for value in tensors.values():
        total += 0 if value is None else value.nbytes
    return total


def time_loader(name, load, path, repeats):
    row = {"loader": name, "seconds_median": None, "seconds_all": [], "bytes": 0, "tensors": 0,
           "error": None}
    try:
        result = load(path)  # warm-up
    except Exception as error:  # noqa: BLE001 - the reason is the result
        row["error"] = f"{type(error).__name__}: {error}"
        return row
    row["bytes"] = nbytes(result)
    row["tensors"] = len(result)
    del result
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = load(path)
        row["seconds_all"].append(time.perf_counter() - start)
        del result
    row["seconds_median"] = statistics.median(row["seconds_all"])
    return row


def save_for_torch(path, torch_path):
    """The file's tensors saved by torch.save, flushed to disk (untimed)."""
    import safetensors.torch
    import torch

    tensors = safetensors.torch.load_file(path)
    torch.save(tensors, torch_path)
    del tensors
    with open(torch_path, "rb") as f:
        os.fsync(f.fileno())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True, help="a safetensors file")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--parse-only", action="store_true",
                        help="time safetensors_open (safe_open and keys()) alone")
    args = parser.parse_args()
    if args.parse_only:
        row = time_loader("safetensors_open", open_safetensors, args.file, args.repeats)
        print(json.dumps({"results": [row]}))
        return

    rows = [
        time_loader("safetensors_numpy", load_safetensors_numpy, args.file, args.repeats),
        time_loader("safetensors_pt", load_safetensors_pt, args.file, args.repeats),
        time_loader("safetensors_pt_lazy", load_safetensors_pt_lazy, args.file, args.repeats),
    ]
    torch_path = args.file + ".pt"
    try:
        save_for_torch(args.file, torch_path)
        rows.append(time_loader("torch_load", load_torch, torch_path, args.repeats))
    except Exception as error:  # noqa: BLE001
        rows.append({"loader": "torch_load", "seconds_median": None, "seconds_all": [],
                     "bytes": 0, "tensors": 0, "error": f"{type(error).__name__}: {error}"})
    finally:
        if os.path.exists(torch_path):
            os.remove(torch_path)
    print(json.dumps({"results": rows}))


if __name__ == "__main__":
    main()
