#!/usr/bin/env bash
# Configures and builds ferry in build/<flavour>: plain (Release, -Werror), asan (ASan+UBSan) or
# tsan (ThreadSanitizer). Usage: scripts/build.sh [plain|asan|tsan] [ninja targets...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flavour=${1:-plain}
shift || true
jobs=${FERRY_JOBS:-2}
# shellcheck source=compiler_cache.sh
source "$root/scripts/compiler_cache.sh"

case "$flavour" in
  plain) flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  # Sanitizer builds: -O1 with line tables only, the cheapest build that still gives readable
  # reports; the tools (benchmark, command line) are not built there.
  asan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
               -DFERRY_SANITIZE=address -DFERRY_BUILD_TOOLS=OFF) ;;
  tsan) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
               -DFERRY_SANITIZE=thread -DFERRY_BUILD_TOOLS=OFF) ;;
  *) echo "usage: $0 [plain|asan|tsan] [targets...]" >&2; exit 2 ;;
esac

build_dir="$root/build/$flavour"
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DFERRY_WERROR=ON "${flags[@]}" >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" ${1:+--target "$@"}
