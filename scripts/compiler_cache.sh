# Sourced by the build scripts: compile through ccache when it is installed (install_deps.sh
# installs it). Every CMake build started from this shell (the flavours, the Python package's
# build, the CMake package tests) picks the launcher up from the environment. Paths under the
# repository are hashed relative to it, so a fresh clone or a worktree elsewhere reuses the cache.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
  export CCACHE_NOHASHDIR=true
fi
