#!/usr/bin/env bash
# Creates (once) the torch_xla environment the torch_xla tests and benchmark run in: torch 2.9.0
# (a CUDA build: several GB of NVIDIA wheels, once), torch_xla 2.9.0, the XLA CPU plugin and
# pytest, pinned in pyproject.toml's [tool.ferry] xla-venv. torch_xla 2.9 needs torch 2.9, so it
# cannot share .venv (torch 2.13). It lives outside the checkout, in
# ${FERRY_XLA_VENV:-${XDG_CACHE_HOME:-~/.cache}/ferry/venv-xla}, so that every clone on the
# machine (CI's fresh ones included) reuses it. Idempotent: it installs only when the pins
# changed. Prints the venv's python path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${FERRY_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry/venv-xla}
python=${FERRY_PYTHON:-python3}
requirements=$("$python" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["tool"]["ferry"]["xla-venv"]))
PY
)
wanted=$(echo "$requirements" | sha256sum | cut -d' ' -f1)
stamp="$venv/.ferry-xla-deps"
if [[ ! -x "$venv/bin/python" ]]; then
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv" >&2
fi
if [[ ! -f $stamp || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "xla_env: installing torch_xla's environment into $venv (several GB, once)" >&2
  echo "$requirements" > "$venv/requirements.txt"
  # --no-cache-dir: the venv is the cache; pip's own copy of the CUDA wheels would be several GB
  # more on disk for nothing.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
    -r "$venv/requirements.txt" >&2
  echo "$wanted" > "$stamp"
fi
echo "$venv/bin/python"
