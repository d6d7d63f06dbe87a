"""What one ferry per process saves: a process that imports ferry and runs JAX on ferry's PJRT
plugin, once with the installed plugin (it links the package's libferry.so: one ferry) and once
with a plugin that carries its own static copy of ferry (a plain CMake build's
ferry_pjrt_plugin.so, as every install was before the shared runtime: two ferries).

Each run is a fresh process doing the same work: import ferry, register the plugin, a put through
ferry (host:0) and a put through JAX on the plugin (8 MiB each, read back). It reports the
process's threads and resident memory (peak and current), how many copies of ferry's code are
mapped, and whether ferry.metrics() saw the plugin's put. Prints a table, then JSON.

Usage: python bench/one_runtime.py --static-plugin build/plain/ferry_pjrt_plugin.so [--repeats 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

PROGRAM = r"""
import json, os, numpy as np
import ferry, ferry.jax
ferry.jax.register()
import jax
x = np.random.default_rng(0).standard_normal((1024, 2048), dtype=np.float32)
a = ferry.device_put(x, "host:0")
assert np.array_equal(ferry.device_get(a), x)
y = jax.device_put(x, jax.devices("ferry")[0])
assert np.array_equal(np.asarray(y), x)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
maps = open("/proc/self/maps").read().splitlines()
ferry_code = sorted({line.split()[-1] for line in maps
                     if line.split()[-1].endswith(("libferry.so", "ferry_pjrt_plugin.so"))})
m = ferry.metrics()
print(json.dumps({
    "threads": int(status["Threads"]),
    "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
    "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
    "libraries": ferry_code,
    "metrics_see_plugin_put": m.get("PjrtPluginPutsByFerry", 0) + m.get("PjrtPluginPutsByPlugin", 0) > 0,
}))
"""


def run_once(plugin):
    env = dict(os.environ)
    if plugin:
        env["FERRY_PJRT_PLUGIN_LIBRARY"] = plugin
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                            timeout=300, env=env)
    if result.returncode != 0:
        sys.exit(f"one_runtime: the run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--static-plugin", required=True,
                        help="a ferry_pjrt_plugin.so with its own static ferry (build/plain)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args()
    layouts = {"one ferry (installed plugin)": None,
               "two ferries (static plugin)": os.path.abspath(args.static_plugin)}
    runs = {name: [] for name in layouts}
    for _ in range(args.repeats):  # interleaved, so a busy moment hits both
        for name, plugin in layouts.items():
            runs[name].append(run_once(plugin))
    rows = {}
    for name, results in runs.items():
        rows[name] = {
            "threads": statistics.median(r["threads"] for r in results),
            "rss_mib": statistics.median(r["rss_mib"] for r in results),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in results),
            "ferry_libraries": results[0]["libraries"],
            "metrics_see_plugin_put": all(r["metrics_see_plugin_put"] for r in results),
        }
    print(f"{'layout':<30} {'threads':>7} {'RSS MiB':>8} {'peak MiB':>8}  metrics see plugin")
    for name, row in rows.items():
        print(f"{name:<30} {row['threads']:>7.0f} {row['rss_mib']:>8.1f} {row['peak_rss_mib']:>8.1f}"
              f"  {row['metrics_see_plugin_put']}")
    print(f"(medians of {args.repeats} fresh processes each, interleaved)")
    report = {"repeats": args.repeats, "cpus": os.cpu_count(), "layouts": rows}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
