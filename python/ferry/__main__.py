"""`python -m ferry ...` and the `ferry` command that `pip install` puts on PATH: both run the
`ferry` command-line program (devices, put, sample; see `ferry --help`), which the package ships
as ferry/bin/ferry."""

from __future__ import annotations

import os
import sys


def _program() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ferry")


def main() -> None:
    """Replaces this process with the `ferry` program, passing the command line on."""
    program = _program()
    if not os.access(program, os.X_OK):
        sys.stderr.write(
            f"ferry: the command-line program is not installed with this package ({program}); "
            "build the package with its tools (pip install . does)\n")
        raise SystemExit(2)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: the file descriptor was closed (python -m ferry ... >&-)
            stream.flush()
    os.execv(program, [program] + sys.argv[1:])


if __name__ == "__main__":
    main()
