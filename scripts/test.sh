#!/usr/bin/env bash
# The whole test suite, as the README and CI run it: installs what it needs, builds, then runs the
# C++ suite plain, under ASan+UBSan and under TSan (each in its own build folder), then builds the
# binary wheel, checks it in a fresh venv, installs it into .venv and runs the pytest suite, then
# runs torch_xla 2.9 on ferry's plugin from torch_xla's own venv (scripts/xla_env.sh).
# In CI (CI=true) every backend must start (host, opencl, pjrt at API 0.81 and 0.115, the plugin):
# a test that needs one that cannot fails with the reason instead of skipping
# (tests/required_backends.h, tests/python/conftest.py; FERRY_REQUIRE_ALL_BACKENDS overrides).
# Each stage prints its time at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# Free disk, in GiB, where the builds and the venvs go. A first run on a new machine keeps about
# 14 GiB (torch_xla's venv with its CUDA wheels 7.3 of it, .venv 2.1, four build folders, the
# compiler cache) and needs 18 at its peak (pip unpacking those wheels; measured 2026-12-06);
# a later run a few hundred MiB. Printed at the start and with every stage, so
# that a build that dies of a full disk says so in the log before the linker's ENOSPC.
# The nearest existing folder at or above $1 (df needs one that exists).
existing() { local path=$1; while [[ ! -e $path && $path != / ]]; do path=$(dirname "$path"); done; echo "$path"; }
free_gib() {
  df -Pk "$root" "$(existing "${FERRY_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry/venv-xla}")" \
    2>/dev/null | awk 'NR > 1 && (min == "" || $4 < min) { min = $4 } END { printf "%.1f", min / 1048576 }'
}
echo "test.sh: $(free_gib) GiB free on the disk of $root"
if awk -v free="$(free_gib)" 'BEGIN { exit !(free < 20) }'; then
  echo "test.sh: warning: a first run needs about 18 GiB of free disk (builds, .venv, torch_xla's" \
    "venv in ${FERRY_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry/venv-xla}); with less a" \
    "build or an install may fail" \
    "with 'No space left on device'" >&2
fi

"$root/scripts/install_deps.sh"
# The Python environment first: it holds the PJRT C API header the builds need for the pjrt
# backend (xla-cpu-pjrt) and the plugins its tests load.
python=$("$root/scripts/python_env.sh" | tail -n 1)
# shellcheck source=compiler_cache.sh
source "$root/scripts/compiler_cache.sh"

# Each stage's time, printed at the end (the README's budget: well under 30 minutes warm).
stage_times=()
stage_name=""
stage_start=$SECONDS
stage() {
  if [[ -n $stage_name ]]; then
    stage_times+=("$(printf '%6ds  %s' $((SECONDS - stage_start)) "$stage_name")")
  fi
  stage_name=$1
  stage_start=$SECONDS
  if [[ -n $1 ]]; then echo "=== $1 === ($(free_gib) GiB free)"; fi
}

run_ctest() {
  local flavour=$1
  shift
  echo "=== ctest ($flavour) ==="
  ctest --test-dir "build/$flavour" --output-on-failure -j "${FERRY_JOBS:-2}" "$@"
}

stage "clang-format (the repository's .clang-format)"
git -C "$root" ls-files '*.cc' '*.h' | (cd "$root" && xargs clang-format --dry-run --Werror)

stage "function length (lizard: no function over 100 lines in src/, tools/, include/ or the Python package)"
# Readable units (STYLE.md): a longer function is split into named steps. lizard prints each
# function over the limit (with its length) and exits non-zero.
"$python" -m lizard --length 100 --CCN 1000 --warnings_only src tools include python/ferry

stage "clang -Wthread-safety (the library, compile only)"
# What each mutex guards is declared with ABSL_GUARDED_BY (src/core/mutex.h); clang checks it. A
# Debug (-O0) build of the library alone, no tests: about 7 CPU minutes (3-4 on 2 cores).
if [[ ! -f build/thread-safety/build.ninja ]]; then
  cmake -S "$root" -B build/thread-safety -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety" \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_TOOLS=OFF >/dev/null
fi
cmake --build build/thread-safety -j "${FERRY_JOBS:-2}" --target ferry

stage "build (plain)"
scripts/build.sh plain
run_ctest plain
stage "README example"
build/plain/ferry_quickstart
stage "CMake package: cmake --install, find_package(ferry), add_subdirectory"
scripts/test_cmake_package.sh build/plain

stage "build (asan)"
scripts/build.sh asan
# The exhaustive 2^32 conversion sweep is too slow under sanitizers; the plain run covers it.
# intercept_tls_get_addr=0: GCC 12's sanitizer runtime takes a dynamic TLS block whose address
# falls at offset 16 of a page for glibc 2.19's layout and reads a bogus range before it, so
# LeakSanitizer's tracer dies at exit (SIGSEGV, "LeakSanitizer has encountered a fatal error")
# after a test has passed: it hit OpenClRegistrationTest in one build out of several, every run,
# and went away with a layout change. Fixed upstream in GCC 14 / LLVM 17; leaks are still checked.
ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1 \
  run_ctest asan -LE exhaustive

stage "build (tsan)"
scripts/build.sh tsan
# The PJRT plugins are prebuilt without TSan: reports inside them are suppressed (the file says
# why). UCX_MEM_EVENTS=no: MPICH (linked into ferry) loads UCX, whose libucm hooks madvise; under
# TSan every thread exit (glibc madvises the dead thread's stack) then crashes inside TSan's
# interceptor (SIGSEGV in ucm_event_enter, seen in the plugin tests when a PJRT client's threads end).
UCX_MEM_EVENTS=no TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan_suppressions.txt" \
  run_ctest tsan -LE exhaustive

stage "binary wheel: pip wheel (build isolation on), auditwheel repair"
# The wheel a user gets: built as a plain `pip install <clone>` builds (the build requirements from
# the package index, not from .venv), then made self-contained (MPI excepted).
wheel=$(scripts/build_wheel.sh | tail -n 1)
stage "the wheel in a fresh venv (compilers, headers and MPI hidden)"
tests/wheel/check_wheel.sh "$wheel"

stage "Python package (the same wheel installed into .venv) and pytest"
# An install from before the distribution was renamed (ferry -> ferry-tensors) would shadow it.
"$python" -m pip uninstall -q -y --disable-pip-version-check ferry >/dev/null 2>&1 || true
"$python" -m pip install -q --no-deps --force-reinstall --disable-pip-version-check "$wheel"
# The `ferry` command that pip put beside the interpreter runs the package's program.
"$(dirname "$python")/ferry" --version
# FERRY_BENCH: the bench's --peers run is tested end to end too (tests/python/test_bench_peers.py).
(cd "$root/tests/python" &&
  FERRY_BENCH="$root/build/plain/ferry-bench" "$python" -m pytest -q -p no:cacheprovider)

stage "torch_xla 2.9 on ferry's plugin (its own venv: scripts/xla_env.sh)"
# torch_xla pins torch 2.9, so it runs from a venv of its own (outside the checkout, made once);
# it gets the same wheel (ferry.torch_xla; numpy, its one dependency there, is in the venv) and
# loads that wheel's plugin, so that the process holds one libferry.so.
xla_python=$("$root/scripts/xla_env.sh" | tail -n 1)
"$xla_python" -m pip install -q --no-deps --force-reinstall --disable-pip-version-check "$wheel"
plugin=$("$xla_python" -c "import ferry.jax; print(ferry.jax.plugin_path())")
(cd "$root/tests/torch_xla" &&
  FERRY_PJRT_PLUGIN_LIBRARY="$plugin" "$xla_python" -m pytest -q -p no:cacheprovider)

stage ""
echo "=== stage times ==="
printf '%s\n' "${stage_times[@]}"
echo "$(printf '%6ds' "$SECONDS")  in all"
echo "=== all test suites passed ==="
