#!/usr/bin/env bash
# The pjrt backend on a real GPU, in one command: installs JAX's CUDA 12 PJRT plugin
# (jax-cuda12-pjrt, with the CUDA libraries it needs, from PyPI) into a virtual environment of its
# own (.venv-gpu, next to the project's .venv), builds ferry, runs the device-API conformance suite
# and the pjrt tests on the CUDA plugin, exports a ferry array's CUDA memory to JAX through DLPack,
# then runs `ferry-bench --device pjrt:0` and prints its table.
#
# Usage: scripts/gpu_check.sh [extra ferry-bench flags, e.g. --size 0.25]
# Needs an NVIDIA GPU and its driver; nothing else. Writes build/gpu_check/bench.json.
# No GPU was lent when this was written: docs/pjrt.md says what was and was not run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 1
fi
nvidia-smi -L

"$root/scripts/install_deps.sh"
"$root/scripts/python_env.sh" >/dev/null  # the header (xla-cpu-pjrt) the build needs

gpu_venv="$root/.venv-gpu"
if [[ ! -x "$gpu_venv/bin/python" ]]; then python3 -m venv "$gpu_venv"; fi
# The CUDA plugin of the JAX release the project pins (pyproject.toml), with its CUDA libraries.
jax_version=$("$root/.venv/bin/python" -c "import jax; print(jax.__version__)")
"$gpu_venv/bin/pip" install -q --disable-pip-version-check "jax[cuda12]==$jax_version"
site=$("$gpu_venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
plugin=$(find "$site" -name 'xla_cuda_plugin.so' | head -n 1)
if [[ -z "$plugin" ]]; then
  echo "gpu_check: jax-cuda12-pjrt did not install xla_cuda_plugin.so under $site" >&2
  exit 1
fi
echo "gpu_check: plugin $plugin"
# The plugin finds the CUDA libraries of the nvidia-* wheels through the site-packages path.
export FERRY_PJRT_PLUGIN="$plugin"
export FERRY_PJRT_SEARCH_PATH="$site"
export LD_LIBRARY_PATH="$(find "$site/nvidia" -maxdepth 2 -name lib -type d | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

"$root/scripts/build.sh" plain ferry_conformance_tests ferry_device_tests ferry-bench ferry_cli
build/plain/ferry devices | grep -E '^(device|pjrt)|^ {10,}'
echo "=== conformance suite on the CUDA plugin (pjrt, pjrt_plugin_paths) ==="
# pjrt_api115 names the CPU plugin of lammps-jax-pjrt-cpu: not this check's business.
build/plain/tests/ferry_conformance_tests --gtest_filter='*/pjrt:*/pjrt_plugin_paths' --gtest_brief=1
echo "=== pjrt tests on the CUDA plugin ==="
build/plain/tests/ferry_device_tests --gtest_filter='Pjrt*' --gtest_brief=1
echo "=== Python: DLPack export of CUDA memory, taken by JAX without a copy ==="
"$gpu_venv/bin/pip" install -q --disable-pip-version-check nanobind scikit-build-core numpy
CMAKE_BUILD_PARALLEL_LEVEL=${FERRY_JOBS:-2} "$gpu_venv/bin/pip" install -q --no-build-isolation \
  --no-deps --disable-pip-version-check "$root"
"$gpu_venv/bin/python" - <<'PYTHON'
import jax, jax.dlpack, numpy as np
import ferry
device = ferry.devices("pjrt")[0]
x = np.arange(4096, dtype=np.float32).reshape(64, 64)
a = ferry.device_put(x, device)
kind, ordinal = a.__dlpack_device__()
assert kind == 2, f"expected kDLCUDA (2), got {(kind, ordinal)}"
j = jax.dlpack.from_dlpack(a)
np.testing.assert_array_equal(np.asarray(j), x)
print(f"DLPack: {device.name} -> jax {j.devices()} (kDLCUDA, ordinal {ordinal}): exact")
# Pinned staging (PJRT_Client_DmaMap) and the allocator's own statistics (PJRT_Device_MemoryStats):
# the CUDA plugin has both, so a converting put stages through pinned chunks and the stats are the
# plugin's.
big = np.arange(1 << 24, dtype=np.float32)
b = ferry.device_put(big, device, device_dtype="bfloat16")
np.testing.assert_array_equal(np.asarray(ferry.device_get(b)[:256], np.float32), big[:256])
stats = device.memory_stats()
print("description:", device.description)
print("memory_stats:", stats)
print("pinned staging bytes:", ferry.metrics().get("PjrtStagingBytesPinned"))
assert "pinned staging" in device.description, device.description
assert stats["source"] == "plugin" and stats["bytes_in_use"] >= b.nbytes, stats
PYTHON
echo "=== ferry-bench --device pjrt:0 ==="
mkdir -p build/gpu_check
build/plain/ferry-bench --device pjrt:0 --json build/gpu_check/bench.json "$@"
