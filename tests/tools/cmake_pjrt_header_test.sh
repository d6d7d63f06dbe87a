#!/usr/bin/env bash
# The PJRT C API header is a build requirement (cmake/ferry_pjrt_header.cmake): configures a copy of
# the source tree (no .venv in it) with only a Python that lacks the xla-cpu-pjrt wheel, and checks:
# - the configure fails, saying how to get the header;
# - -DFERRY_PJRT=OFF configures, saying the backend and the plugin are left out;
# - -DFERRY_PJRT_C_API_INCLUDE_DIR=<a folder with the header> configures with the backend, and a
#   folder without it fails naming that folder.
# Usage: cmake_pjrt_header_test.sh SOURCE_DIR HEADER_DIR
set -euo pipefail
source_dir=$1
header_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A copy without .venv and build folders: the configure finds no header there.
tar -C "$source_dir" --exclude=./.venv --exclude=./build --exclude=./.git -cf - . | tar -C "$work" -xf -
mkdir -p "$work/bin"
# The only python3 on PATH has no xla-cpu-pjrt.
python_without_header=/usr/bin/python3
if ! [[ -x $python_without_header ]] || "$python_without_header" -c "import xla_plugins.xla_cpu_pjrt" 2>/dev/null; then
  echo "no python3 without xla-cpu-pjrt on this machine: cannot run the check" >&2
  exit 1
fi
ln -s "$python_without_header" "$work/bin/python3"
configure() {  # configure [cmake args...]: output in $work/log, status returned
  rm -rf "$work/build"
  env PATH="$work/bin:/usr/bin:/bin" cmake -S "$work" -B "$work/build" -G Ninja \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_TOOLS=OFF "-DPython_EXECUTABLE=$python_without_header" \
    "$@" >"$work/log" 2>&1
}
expect() {  # expect WHAT PATTERN: the last configure's output has PATTERN
  if ! grep -q -- "$2" "$work/log"; then
    echo "FAILED: $1: no '$2' in the configure's output:" >&2
    cat "$work/log" >&2
    exit 1
  fi
  echo "ok: $1"
}

if configure; then
  echo "FAILED: the configure succeeded without any pjrt_c_api.h" >&2
  cat "$work/log" >&2
  exit 1
fi
expect "no header: the configure fails" "no PJRT C API header"
expect "no header: it says how to get it" "FERRY_PJRT=OFF"
expect "no header: it names the Python it asked" "$python_without_header"

configure -DFERRY_PJRT=OFF
expect "FERRY_PJRT=OFF: configures without the backend" "pjrt backend and plugin left out"

configure "-DFERRY_PJRT_C_API_INCLUDE_DIR=$header_dir"
expect "an explicit header folder: configures with the backend" "pjrt backend and plugin with"

if configure "-DFERRY_PJRT_C_API_INCLUDE_DIR=$work/bin"; then
  echo "FAILED: a folder without the header configured" >&2
  exit 1
fi
expect "a folder without the header: the configure names it" "holds no"
