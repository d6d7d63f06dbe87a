#!/usr/bin/env bash
# Installs every system dependency of ferry from Debian's packages.
# Idempotent: installs only what is missing, so it is cheap to run before every build.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config clang-format
  # compiler cache: rebuilds of unchanged sources (scripts/compiler_cache.sh)
  ccache
  # clang and its runtime libraries: the libFuzzer targets (FERRY_BUILD_FUZZERS)
  clang libclang-rt-14-dev
  # C++ libraries (found by CMake with find_package / pkg-config)
  libabsl-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev libtbb-dev libdlpack-dev
  # zlib: deflated .npz members
  zlib1g-dev
  # OpenCL: the ICD loader, headers and PoCL (OpenCL on the CPU)
  ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
  # MPI (MPICH): many processes (src/distributed), mpiexec for the multi-process tests
  mpich libmpich-dev
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install_deps: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
