#!/usr/bin/env bash
# The binary wheel works where a user installs it: a fresh venv on a machine with no compiler, no
# -dev package and no MPI. Usage: tests/wheel/check_wheel.sh WHEEL
#
# 1. A fresh venv gets the wheel with its dependencies (xla-cpu-pjrt among them: the pjrt device),
#    and JAX for the plugin, from the package index: nothing is compiled.
# 2. Every ELF file of the installed package resolves its libraries inside the package or to the
#    manylinux policy's system libraries (glibc, libstdc++, libgcc_s), never to a library that only
#    a -dev package or a build would bring; only libferry_mpi.so needs MPI, and the system's.
# 3. The check runs (check_wheel.py) in a private mount namespace where the compilers, the system
#    headers and the system's MPI library are hidden: host, opencl (PoCL's ICD is a system
#    package), pjrt, the JAX plugin and the `ferry` command work; `import ferry` works without
#    MPI, and ferry.distributed says how to get it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
wheel=$(realpath "$1")
venv="$root/build/wheel/clean-venv"
python=${FERRY_PYTHON:-python3}

echo "check_wheel: a fresh venv with $(basename "$wheel")"
rm -rf "$venv"
"$python" -m venv "$venv"
# The versions the test suite pins (pyproject.toml's test extra), so pip takes them from its cache.
pins=$("$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    test = tomllib.load(f)["project"]["optional-dependencies"]["test"]
print(" ".join(r for r in test if r.split("==")[0] in ("numpy", "ml_dtypes", "jax")))
PY
)
# shellcheck disable=SC2086
"$venv/bin/pip" install -q --disable-pip-version-check --only-binary :all: "$wheel" $pins

echo "check_wheel: what each library of the package resolves to"
"$venv/bin/python" - "$venv" <<'PY'
import os, pathlib, subprocess, sys

site = next(pathlib.Path(sys.argv[1]).glob("lib/python3*/site-packages"))
package = site / "ferry"
grafted = site / "ferry_tensors.libs"
# The manylinux policy's libraries (what auditwheel leaves out): every Linux system has them.
policy = ("libc.so", "libm.so", "libstdc++.so", "libgcc_s.so", "libpthread.so", "libdl.so",
          "librt.so", "libz.so", "libutil.so", "libresolv.so", "libnsl.so", "ld-linux")
problems, checked = [], 0
for path in sorted(p for p in package.rglob("*") if p.is_file()):
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            continue
    checked += 1
    # The file's own needs (NEEDED), and where the loader finds each (ldd).
    dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    needed = [line.split("[", 1)[1].split("]", 1)[0] for line in dynamic.splitlines()
              if "(NEEDED)" in line]
    resolved = {}
    for line in subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout.splitlines():
        name, _, where = line.strip().partition(" => ")
        resolved[name] = where.split(" (")[0].strip()
    for name in needed:
        where = resolved.get(name, "")
        if name.startswith("libmpich"):
            if path.name != "libferry_mpi.so":
                problems.append(f"{path.name} needs MPI ({name}): only libferry_mpi.so may")
        elif name.startswith(policy):
            continue
        elif not where or where == "not found":
            problems.append(f"{path.name}: {name} not found")
        elif not where.startswith((str(package), str(grafted))):
            problems.append(f"{path.name}: {name} resolves outside the wheel to {where}")
print(f"check_wheel: {checked} ELF files checked")
if checked < 5:  # _ferry, libferry.so, libferry_mpi.so, the plugin, bin/ferry
    problems.append(f"only {checked} ELF files in the package")
if problems:
    sys.exit("check_wheel: " + "\n  ".join(["the wheel is not self-contained:", *problems]))
PY

echo "check_wheel: the package at work, with the compilers, headers and MPI hidden"
mpich=$(realpath /usr/lib/x86_64-linux-gnu/libmpich.so.12 2>/dev/null || true)
hide=""
for compiler in /usr/bin/cc /usr/bin/c++ /usr/bin/gcc /usr/bin/g++ /usr/bin/clang /usr/bin/clang++; do
  [[ -e $compiler ]] && hide+="mount --bind /dev/null $(realpath "$compiler"); "
done
[[ -n $mpich ]] && hide+="mount --bind /dev/null $mpich; "
hide+="mount -t tmpfs none /usr/include; "
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private bash -c \
    "$hide exec env -u VIRTUAL_ENV PATH='$venv/bin:/usr/bin:/bin' \
       '$venv/bin/python' '$here/check_wheel.py' --mpi-hidden"
else
  # Without the right to make a mount namespace (not root), the same check with everything in
  # place: MPI is then present, and the check asks for it to work instead.
  echo "check_wheel: no mount namespace here: checking with the system as it is"
  env -u VIRTUAL_ENV PATH="$venv/bin:/usr/bin:/bin" "$venv/bin/python" "$here/check_wheel.py"
fi
echo "check_wheel: the wheel works in a fresh venv"
