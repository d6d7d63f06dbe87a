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
# The build requirements in .venv (the PJRT C API header among them: without it the configure
# fails rather than leave the pjrt backend out). Cheap when they are there.
"$root/scripts/python_env.sh" --build >/dev/null

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
# Configured every time (seconds): the configure looks for what the environment has now (the PJRT
# header, MPI, OpenCL's headers) and never keeps an answer from before the environment existed.
cmake -S "$root" -B "$build_dir" -G Ninja -DFERRY_WERROR=ON "${flags[@]}" >/dev/null
cmake --build "$build_dir" -j "$jobs" ${1:+--target "$@"}
