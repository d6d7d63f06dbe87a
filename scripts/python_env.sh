#!/usr/bin/env bash
# Creates (once) the project's virtual environment in .venv and installs the pinned Python
# dependencies of pyproject.toml's `test` extra plus the build tools. Idempotent: it reinstalls
# only when pyproject.toml changed. Prints the venv's python path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
python=${FERRY_PYTHON:-python3}

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv" >&2
fi
stamp="$venv/.ferry-deps"
wanted=$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "python_env: installing the pinned Python dependencies into .venv" >&2
  "$venv/bin/python" - "$root/pyproject.toml" > "$venv/requirements.txt" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)
for requirement in project["build-system"]["requires"] + project["project"]["optional-dependencies"]["test"]:
    print(requirement)
PY
  # mpi4py is installed below, only where an MPI compiler is.
  grep -v '^mpi4py==' "$venv/requirements.txt" > "$venv/requirements-no-mpi.txt" || true
  "$venv/bin/pip" install -q --disable-pip-version-check ninja cmake \
    -r "$venv/requirements-no-mpi.txt" >&2
  echo "$wanted" > "$stamp"
fi
# mpi4py (the interop test) is compiled against the MPI that ferry links (mpicc: Debian's MPICH):
# PyPI's wheel needs libmpi.so.12, a name Debian's MPICH does not provide (libmpich.so.12). At -O0
# the build takes under a minute here (at -O3 several); it carries only the test's few calls.
# Rebuilt when missing, of another version, or unable to load; skipped without mpicc (the test
# then skips).
mpicc=${MPICC:-mpicc}
mpi4py=$(grep '^mpi4py==' "$venv/requirements.txt" || true)
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
