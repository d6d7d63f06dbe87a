#!/usr/bin/env bash
# ferry as other projects use it (tests/cmake_package): `cmake --install` of an already built tree
# into a temporary prefix, a project that finds it with find_package(ferry) built and run against
# that prefix, then the same project with ferry added by add_subdirectory (its library compiled
# again, without optimisation to keep it cheap, with ferry's -Werror on to show that ferry's
# warning flags stay on ferry's own targets). Usage: scripts/test_cmake_package.sh [BUILD_DIR]
# (default build/plain, which must be built).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/plain}
jobs=${FERRY_JOBS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")

echo "--- cmake --install $build"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for required in include/ferry/version.h include/ferry/runtime/transfer.h lib/libferry.a \
                lib/cmake/ferry/ferryConfig.cmake lib/cmake/ferry/ferryConfigVersion.cmake \
                lib/cmake/ferry/ferryTargets.cmake; do
  [[ -f "$work/prefix/$required" ]] || { echo "FAIL: the install has no $required"; exit 1; }
done
# The installed package must not point back into the source or build tree.
if grep -rl -e "$root/include" -e "$build" "$work/prefix/lib/cmake/ferry"; then
  echo "FAIL: the installed CMake package refers to the source or build tree"; exit 1
fi

echo "--- find_package(ferry) against the install"
cmake -S "$root/tests/cmake_package" -B "$work/package" -G Ninja -DFERRY_CONSUMER_MODE=package \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DFERRY_EXPECTED_VERSION="$version" >/dev/null
cmake --build "$work/package" -j "$jobs" >/dev/null
"$work/package/consumer"

echo "--- add_subdirectory(ferry)"
cmake -S "$root/tests/cmake_package" -B "$work/subdirectory" -G Ninja \
  -DFERRY_CONSUMER_MODE=subdirectory -DFERRY_SOURCE_DIR="$root" -DFERRY_WERROR=ON >/dev/null
cmake --build "$work/subdirectory" -j "$jobs" --target consumer >/dev/null
"$work/subdirectory/consumer"
echo "cmake package: both ways built and ran"
