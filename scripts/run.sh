#!/usr/bin/env bash
# The main job: installs what it needs, builds ferry, writes a sample checkpoint (a transformer-like
# safetensors file with mixed dtypes) and puts every tensor of it on the embedded host device with
# `ferry put --verify`, printing the per-tensor table and the totals.
# Environment: FERRY_SAMPLE_SIZE (default 256MiB), FERRY_DEVICE (default host:0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install_deps.sh"
"$root/scripts/build.sh" plain ferry_cli >/dev/null
ferry="$root/build/plain/ferry"
sample="$root/build/sample.safetensors"
"$ferry" sample "$sample" --size "${FERRY_SAMPLE_SIZE:-256MiB}"
exec "$ferry" put "$sample" --device "${FERRY_DEVICE:-host:0}" --verify "$@"
