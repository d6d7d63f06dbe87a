#!/usr/bin/env bash
# The main job: installs what it needs, builds ferry, and runs the transfer benchmark on the
# embedded host device, printing its table. Extra arguments go to ferry-bench (e.g. --size 0.25,
# --json results.json, --case h2d_contiguous).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh" plain ferry-bench >/dev/null
exec "$root/build/plain/ferry-bench" --device host:0 "$@"
