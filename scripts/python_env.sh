#!/usr/bin/env bash
# Creates (once) the project's virtual environment in .venv and installs into it:
# - with --build: the build requirements only (pyproject.toml's [build-system].requires, with the
#   PJRT C API header's wheel, plus ninja and cmake, and [tool.ferry].wheel-tools): what a CMake
#   build of ferry or its wheel needs, and all that scripts/build.sh (and so scripts/run.sh) asks
#   for;
# - by default: those and the pinned `test` extra (torch, jax, the PJRT plugins, pytest, mpi4py);
# - with --bench: those and the `bench` extra (the checkpoint loaders bench/fresh_loads.py times).
# Idempotent: it installs only when pyproject.toml changed since the last install of that kind.
# Prints the venv's python path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
python=${FERRY_PYTHON:-python3}
mode=full
if [[ ${1:-} == --build ]]; then mode=build; fi
if [[ ${1:-} == --bench ]]; then mode=bench; fi

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv" >&2
fi
wanted=$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)
requirements() {  # the requirements of a kind (build or full), one a line
  "$venv/bin/python" - "$root/pyproject.toml" "$1" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
wanted = list(project["build-system"]["requires"]) + project["tool"]["ferry"]["wheel-tools"]
extras = project["project"]["optional-dependencies"]
if sys.argv[2] in ("full", "bench"):
    wanted += extras["test"]
if sys.argv[2] == "bench":
    wanted += extras["bench"]
for requirement in wanted:
    print(requirement)
PY
}
install_kind() {  # installs a kind's requirements unless its stamp says they are there
  local kind=$1 stamp="$venv/.ferry-deps-$1"
  if [[ -f $stamp && "$(cat "$stamp")" == "$wanted" ]]; then return; fi
  echo "python_env: installing the pinned Python dependencies ($kind) into .venv" >&2
  requirements "$kind" > "$venv/requirements-$kind.txt"
  # mpi4py is installed below, only where an MPI compiler is.
  grep -v '^mpi4py==' "$venv/requirements-$kind.txt" > "$venv/requirements-$kind-no-mpi.txt" || true
  "$venv/bin/pip" install -q --disable-pip-version-check ninja cmake \
    -r "$venv/requirements-$kind-no-mpi.txt" >&2
  echo "$wanted" > "$stamp"
}
install_kind build
if [[ $mode == build ]]; then
  echo "$venv/bin/python"
  exit 0
fi
install_kind full
if [[ $mode == bench ]]; then install_kind bench; fi
# mpi4py (the interop test) is compiled against the MPI that ferry links (mpicc: Debian's MPICH):
# PyPI's wheel needs libmpi.so.12, a name Debian's MPICH does not provide (libmpich.so.12). At -O0
# the build takes under a minute here (at -O3 several); it carries only the test's few calls.
# Rebuilt when missing, of another version, or unable to load; skipped without mpicc (the test
# then skips).
mpicc=${MPICC:-mpicc}
mpi4py=$(requirements full | grep '^mpi4py==' || true)
if [[ -n $mpi4py ]] && command -v "$mpicc" >/dev/null &&
  ! "$venv/bin/python" - "${mpi4py#mpi4py==}" 2>/dev/null <<'PY'
import sys, mpi4py
mpi4py.rc.initialize = False  # load the library only
from mpi4py import MPI
sys.exit(mpi4py.__version__ != sys.argv[1])
PY
then
  echo "python_env: building $mpi4py against $(command -v "$mpicc")" >&2
  MPICC=$mpicc CFLAGS="-O0 -g0" "$venv/bin/pip" install -q --disable-pip-version-check \
    --no-binary mpi4py --no-deps --force-reinstall "$mpi4py" >&2
fi
echo "$venv/bin/python"
