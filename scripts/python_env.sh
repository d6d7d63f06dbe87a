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
  "$venv/bin/pip" install -q --disable-pip-version-check ninja cmake -r "$venv/requirements.txt" >&2
  echo "$wanted" > "$stamp"
fi
echo "$venv/bin/python"
