#!/usr/bin/env bash
# Builds ferry's binary wheel, as a user's `pip install` of the source would build it, then makes
# it installable anywhere:
# 1. `pip wheel` of the source tree with build isolation on: the build requirements (scikit-build-
#    core, nanobind, and xla-cpu-pjrt for pjrt_c_api.h) come from the package index into a
#    temporary environment, not from .venv: the check that a plain `pip install <clone>` carries
#    the pjrt backend and the plugin (the build fails otherwise, cmake/ferry_pjrt_header.cmake).
# 2. `auditwheel repair`: copies into the wheel the libraries it links beyond the manylinux policy
#    (abseil, fmt, oneTBB, zlib) and tags it manylinux. MPI is excluded: libferry_mpi.so keeps
#    needing the system's libmpich.so.12 and is opened only when a program asks for many processes
#    (a second MPI inside the package would break mpiexec and mpi4py).
# Usage: scripts/build_wheel.sh [output folder] (default build/wheel/dist). Prints the repaired
# wheel's path on its last line. Reuses build/python (scikit-build-core's build folder) and the
# compiler cache, so a rebuild compiles only what changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build/wheel/dist}")
# shellcheck source=compiler_cache.sh
source "$root/scripts/compiler_cache.sh"
python=$("$root/scripts/python_env.sh" --build | tail -n 1)
venv_bin=$(dirname "$python")

raw="$root/build/wheel/raw"
rm -rf "$raw"
mkdir -p "$raw" "$out"
echo "build_wheel: pip wheel (build isolation on)" >&2
CMAKE_BUILD_PARALLEL_LEVEL=${FERRY_JOBS:-2} "$python" -m pip wheel -q --no-deps \
  --disable-pip-version-check -w "$raw" "$root" >&2
wheel=$(ls "$raw"/*.whl)

echo "build_wheel: auditwheel repair (MPI left to the system)" >&2
rm -f "$out"/ferry_tensors-*.whl
PATH="$venv_bin:$PATH" "$venv_bin/auditwheel" repair --exclude 'libmpich.so.*' -w "$out" \
  "$wheel" >&2
repaired=$(ls "$out"/ferry_tensors-*manylinux*.whl)
echo "build_wheel: $(du -h "$repaired" | cut -f1) $repaired" >&2
echo "$repaired"
