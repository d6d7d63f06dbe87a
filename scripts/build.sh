#!/usr/bin/env bash
# Configures and builds ferry in build/<flavour>: plain (Release, -Werror), asan (ASan+UBSan) or
# tsan (ThreadSanitizer). Usage: scripts/build.sh [plain|asan|tsan] [ninja targets...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flavour=${1:-plain}
shift || true
jobs=${FERRY_JOBS:-2}

case "$flavour" in
  plain) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=address -DFERRY_BUILD_TOOLS=OFF) ;;
  tsan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_SANITIZE=thread -DFERRY_BUILD_TOOLS=OFF) ;;
  *) echo "usage: $0 [plain|asan|tsan] [targets...]" >&2; exit 2 ;;
esac

build_dir="$root/build/$flavour"
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DFERRY_WERROR=ON "${flags[@]}" >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" ${1:+--target "$@"}
