"""torch_xla 2.9 next to ferry on the same transfers: each configuration in a process of its own.

  torch_xla (cpu)     torch_xla's built-in CPU client (PJRT_DEVICE=CPU): `.to(xla)`, `.cpu()`
  torch_xla (plugin)  torch_xla on the bare XLA CPU plugin (PJRT_DEVICE=LIBRARY)
  torch_xla (ferry)   torch_xla on ferry's plugin wrapping that plugin
  ferry host:0 / ferry pjrt:0   ferry.device_put / device_get (from .venv, torch 2.13)

Cases (torch's sources; a put is timed until the data is on the device, a read until it is back):
  contiguous   4096x4096 float32
  transpose    its .t() (torch_xla makes a contiguous copy first; ferry reads the strides)
  strided      every other row and column of 8192x8192 float32
  f64_as_f32   4096x4096 float64 stored as float32 (torch_xla: .to(torch.float32) then
               .to(xla), the conversion its own XLA_DOWNCAST path does; ferry: device_dtype)
  bf16         4096x4096 bfloat16
  read         device -> host of 4096x4096 float32 (`.cpu()`; ferry: device_get)
  read8        8 device -> host reads of 1024x1024 float32 started together (torch_xla: 8 tensors
               just computed, `x * 2 + 1` after `sync(wait=False)`, read by
               `_xla_get_cpu_tensors`; ferry: `device_get` of a list of 8 arrays)
  read8_serial the same 8 reads one after the other (`.cpu()` each; ferry: `device_get` each)
Medians of --repeats runs after one warm-up, and the peak extra host memory of one transpose put
(ru_maxrss of a process that does only that, over one that only makes the source, less the 64 MiB
of the device copy itself: CPU device memory is host memory).

Usage: python bench/torch_xla_peers.py --xla-python <xla venv python> [--plugin PATH]
(scripts/xla_env.sh makes that venv and prints its python; `ferry-bench --peers` runs this script
when the venv is there). Prints a table; --json PATH writes the numbers (- for stdout, with
{"results": ...} as ferry-bench reads it).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_json import write_document

CASES = ["contiguous", "transpose", "strided", "f64_as_f32", "bf16", "read", "read8", "read8_serial"]

CHILD = r'''
import json, os, resource, statistics, sys, time
import torch
mode, repeats, case_filter = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def sources():
    """The cases' sources, made one at a time (a memory run makes only its own)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4096, 4096, generator=g)
    makers = {
        "contiguous": lambda: base, "transpose": lambda: base.t(),
        "strided": lambda: torch.randn(8192, 8192, generator=g)[::2, ::2],
        "f64_as_f32": lambda: base.double(), "bf16": lambda: base.bfloat16(), "read": lambda: base,
        "read8": lambda: [torch.full((1024, 1024), float(i)) for i in range(8)],
        "read8_serial": lambda: [torch.full((1024, 1024), float(i)) for i in range(8)],
    }
    for name, make in makers.items():
        if not case_filter or name in case_filter.split(","):
            yield name, make()

def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return statistics.median(times) if times else None

results = {}
errors = {}  # case -> the first line of its error, for a case that cannot run in this configuration
if mode.startswith("xla"):
    import torch_xla
    dev = torch_xla.device()
    for name, src in sources():
        if name == "read":
            on = src.to(dev); torch_xla.sync()
            results[name] = timed(lambda: on.cpu(), repeats)
            continue
        if name.startswith("read8"):
            ons = [each.to(dev) for each in src]; torch_xla.sync()

            def computed(ons=ons):
                outs = [on * 2 + 1 for on in ons]
                torch_xla.sync(wait=False)
                return outs
            read8 = ((lambda: torch_xla._XLAC._xla_get_cpu_tensors(computed())) if name == "read8"
                     else (lambda: [out.cpu() for out in computed()]))
            try:
                results[name] = timed(read8, repeats)
            except RuntimeError as error:  # torch_xla 2.9 cannot compute on the bare 0.81 plugin
                errors[name] = str(error).splitlines()[0]
            continue
        convert = (lambda s: s.to(torch.float32)) if name == "f64_as_f32" else (lambda s: s)

        def put_and_wait():
            x = convert(src).to(dev)
            torch_xla.sync()
            torch_xla._XLAC._xla_wait_device_ops([])
        results[name] = timed(put_and_wait, repeats)
else:
    import ferry
    device = ferry.device(mode)
    for name, src in sources():
        if name.startswith("read8"):
            ons = [ferry.device_put(each, device).block_until_ready() for each in src]
            read8 = ((lambda: ferry.device_get(ons)) if name == "read8"
                     else (lambda: [ferry.device_get(on) for on in ons]))
            results[name] = timed(read8, repeats)
            continue
        if name == "read":
            on = ferry.device_put(src, device).block_until_ready()
            out = torch.empty_like(src).numpy()
            results[name] = timed(lambda: ferry.device_get(on, out=out), repeats)
            continue
        kwargs = {"device_dtype": "float32"} if name == "f64_as_f32" else {}
        results[name] = timed(lambda: ferry.device_put(src, device, **kwargs).block_until_ready(),
                              repeats)
print(json.dumps({"seconds": results, "errors": errors,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def run(python, mode, repeats, env, cases=""):
    out = subprocess.run([python, "-c", CHILD, mode, str(repeats), cases], env=env,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xla-python", required=True)
    parser.add_argument("--ferry-python", default=sys.executable)
    parser.add_argument("--plugin", help="ferry_pjrt_plugin.so (default: the one of the ferry "
                        "package that --ferry-python imports)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.plugin is None:
        args.plugin = subprocess.run(
            [args.ferry_python, "-c", "import ferry.jax; print(ferry.jax.plugin_path())"],
            capture_output=True, text=True, check=True).stdout.strip()
    bare = subprocess.run(
        [args.xla_python, "-c", "import xla_plugins, os; print(os.path.join(list("
         "xla_plugins.__path__)[0], 'xla_cpu_pjrt', 'xla_cpu_pjrt.so'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    base = dict(os.environ)
    configs = {
        "torch_xla (cpu)": (args.xla_python, "xla", dict(base, PJRT_DEVICE="CPU")),
        "torch_xla (plugin)": (args.xla_python, "xla",
                               dict(base, PJRT_DEVICE="LIBRARY", PJRT_LIBRARY_PATH=bare)),
        "torch_xla (ferry)": (args.xla_python, "xla",
                              dict(base, PJRT_DEVICE="LIBRARY", PJRT_LIBRARY_PATH=args.plugin,
                                   FERRY_PJRT_WRAPPED_PLUGIN=bare)),
        "ferry host:0": (args.ferry_python, "host:0", base),
        "ferry pjrt:0": (args.ferry_python, "pjrt:0", base),
    }
    results = {name: run(python, mode, args.repeats, env) for name, (python, mode, env)
               in configs.items()}
    # Peak extra host memory of one transpose put: the transpose alone, less the source alone.
    memory = {}
    for name, (python, mode, env) in configs.items():
        alone = run(python, mode, 0, env, "none")
        transposed = run(python, mode, 0, env, "transpose")
        if "error" not in alone and "error" not in transposed:
            # Beyond the device copy itself (CPU device memory is host memory: 64 MiB).
            memory[name] = transposed["peak_rss"] - alone["peak_rss"] - 4096 * 4096 * 4
    out = sys.stderr if args.json == "-" else sys.stdout
    reference = results["torch_xla (cpu)"].get("seconds", {})
    print(f"{'case':<12}" + "".join(f"{name:>20}" for name in configs), file=out)
    for case in CASES:
        row = f"{case:<12}"
        for name in configs:
            seconds = results[name].get("seconds", {}).get(case)
            if seconds is None:
                row += f"{'error':>20}"
                continue
            ratio = reference.get(case, 0) / seconds if seconds else 0
            row += f"{seconds * 1e3:>11.2f} ms {ratio:>5.1f}x"
        print(row, file=out)
    print("extra host memory of the transpose put: " +
          ", ".join(f"{name} {value / 2**20:.1f} MiB" for name, value in memory.items()),
          file=out)
    for name, result in results.items():
        if "error" in result:
            print(f"{name}: {result['error']}", file=out)
        for case, error in result.get("errors", {}).items():
            print(f"{name}, {case}: {error}", file=out)
    document = {"results": results, "extra_memory_transpose": memory,
                "ratio_base": "torch_xla (cpu)"}
    write_document(document, args.json)


if __name__ == "__main__":
    main()
