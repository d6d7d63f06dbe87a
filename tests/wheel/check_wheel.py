"""Run by check_wheel.sh in the fresh venv that holds the binary wheel: each backend, the JAX
plugin and the `ferry` command work from the installed wheel alone. With --mpi-hidden the system's
MPI library is hidden: `import ferry` and every single-process path work, and asking for many
processes fails with an error that says how to get MPI. Exits non-zero with the reason on the
first failure; prints one line per check."""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

import ferry
import ferry.jax

mpi_hidden = "--mpi-hidden" in sys.argv
package_dir = os.path.dirname(ferry.__file__)


def check(what, condition, detail=""):
    if not condition:
        sys.exit(f"check_wheel.py: FAILED: {what} {detail}")
    print(f"check_wheel.py: ok: {what}")


check("ferry comes from the fresh venv", package_dir.startswith(sys.prefix), package_dir)
x = np.arange(24.0).reshape(4, 6)
for backend in ("host", "opencl", "pjrt"):
    try:
        device = ferry.devices(backend)[0]
    except ferry.Error as error:
        if backend == "opencl" and not os.path.isdir("/etc/OpenCL/vendors"):
            print(f"check_wheel.py: skipped: opencl (no OpenCL ICD installed: {error})")
            continue
        check(f"the {backend} backend starts", False, str(error))
    a = ferry.device_put(x.T, device, device_dtype="float32")
    check(f"{backend}: a strided, converted put and its read",
          np.array_equal(ferry.device_get(a), x.T), device.name)

plugin = ferry.jax.plugin_path()
check("ferry_pjrt_plugin.so lies in the package", os.path.dirname(plugin) == package_dir, plugin)
program = """
import json, numpy as np, ferry, ferry.jax
ferry.jax.register()
import jax
x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
y = np.asarray(jax.device_put(x.T, jax.devices("ferry")[0]) * 2)
m = ferry.metrics()
print(json.dumps({"ok": y.tolist() == (x.T * 2).tolist(),
                  "puts": m.get("PjrtPluginPutsByFerry", 0) + m.get("PjrtPluginPutsByPlugin", 0)}))
"""
run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
check("JAX computes on ferry's plugin, and ferry.metrics() counts its put",
      run.returncode == 0 and '"ok": true' in run.stdout and '"puts": 0' not in run.stdout,
      run.stdout + run.stderr[-2000:])

ferry_command = shutil.which("ferry")
check("the ferry command is on the venv's PATH", ferry_command is not None)
with tempfile.TemporaryDirectory() as folder:
    sample = os.path.join(folder, "sample.safetensors")
    for args in (["sample", sample, "--size", "2MiB"], ["put", sample, "--verify"]):
        run = subprocess.run([ferry_command, *args], capture_output=True, text=True, timeout=300)
        check(f"ferry {args[0]}", run.returncode == 0, run.stdout + run.stderr[-2000:])

if mpi_hidden:
    loaded = open("/proc/self/maps").read()
    check("nothing loaded MPI", "libmpich" not in loaded)
    # A process that mpiexec started (PMI_* set) asks for an MPI group.
    run = subprocess.run(
        [sys.executable, "-c", "import ferry.distributed as d; d.initialize()"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PMI_RANK": "0", "PMI_SIZE": "1"})
    message = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    print(f"check_wheel.py: without MPI, ferry.distributed says: {message}")
    check("without MPI, ferry.distributed fails saying how to get it",
          run.returncode != 0 and "apt install mpich" in message, run.stdout + run.stderr[-2000:])
