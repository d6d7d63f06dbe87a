#!/usr/bin/env python3
"""Holds every quoted #include of src/, include/, tools/ and bench/ against the layer table
(tests/tools/include_layers.txt): a backend that includes another backend's header, the device
layer that reaches into the runtime, fails here, naming the file, the line and the layer's rule.

Usage: include_layers_test.py [REPO_ROOT]   (ctest `include_layers` runs it on the source tree)
Exit status 0 when every include is allowed, 1 otherwise (each violation on its own line).
"""

import pathlib
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
CHECKED = ("src/", "include/", "tools/", "bench/")
# The project's own headers, as they are included; any other quoted include is a library's.
PROJECT = ("ferry/", "src/", "tools/", "bench/")


def read_table(path):
    """{layer folder: [allowed prefixes]} from the table's `LAYER: ALLOWED ...` lines."""
    table = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        layer, sep, allowed = line.partition(":")
        if not sep:
            raise SystemExit(f"{path}:{number}: not 'LAYER: ALLOWED ...': {line!r}")
        table[layer.strip().rstrip("/")] = allowed.split()
    return table


def layer_of(path, table):
    """The longest layer folder that holds `path`, or None."""
    best = None
    for layer in table:
        if (path.startswith(layer + "/")) and (best is None or len(layer) > len(best)):
            best = layer
    return best


def own_prefix(layer):
    """What a layer's own includes start with: include/ferry/x is included as ferry/x."""
    return layer[len("include/"):] if layer.startswith("include/") else layer


def check(root):
    table = read_table(root / "tests" / "tools" / "include_layers.txt")
    files = subprocess.run(["git", "-C", str(root), "ls-files", *CHECKED], capture_output=True,
                           text=True, check=True).stdout.split()
    violations = []
    checked = 0
    for name in files:
        if not name.endswith((".h", ".cc")):
            continue
        layer = layer_of(name, table)
        if layer is None:
            violations.append(f"{name}: in no layer of the table")
            continue
        allowed = [own_prefix(layer)] + table[layer]
        for number, line in enumerate((root / name).read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if match is None:
                continue
            target = match.group(1)
            checked += 1
            if not target.startswith(PROJECT):  # a library's header (absl/, fmt/, nlohmann/...)
                continue
            if not any(target == prefix or target.startswith(prefix.rstrip("/") + "/")
                       or (prefix.endswith("/") and target.startswith(prefix))
                       for prefix in allowed):
                violations.append(f"{name}:{number}: includes \"{target}\", which layer {layer} "
                                  f"may not (it may: {' '.join(allowed)})")
    return checked, violations


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[2])
    checked, violations = check(root)
    for violation in violations:
        print(violation)
    print(f"include_layers: {checked} includes checked, {len(violations)} not allowed")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
