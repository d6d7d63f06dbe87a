"""Many processes (JAX's multi-controller model) over MPI: see docs/distributed.md.

Start the program with `mpiexec -n N python prog.py` and call `ferry.distributed.initialize()`
first: every process then knows its `ferry.process_index()`, `ferry.global_devices()` lists every
process's devices, a `Mesh` may hold them all, and each process sends and reads only its own
shards. Without mpiexec, `initialize()` does nothing and ferry is one process, as always.

Collective calls (`initialize`, `global_devices`, a sharded `load_file`) must be made by every
process in the same order. None of them hangs: when a process fails, every process raises the
same error naming it; when one dies, the others raise an error saying so (see docs/distributed.md
for the failure model and FERRY_DISTRIBUTED_TIMEOUT_S).
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Iterator

from . import _ferry

__all__ = ["initialize", "shutdown", "is_initialized", "engine"]

_initialized = False


def initialize() -> None:
    """Joins the job this program was started in: under mpiexec, the MPI job (MPI is initialised
    here unless the program already did, e.g. by importing mpi4py; ferry never finalizes an MPI it
    did not initialise); otherwise a no-op, one process. Idempotent. Also gathers the host
    backend's global device list (a collective call)."""
    global _initialized
    if _initialized:
        return
    _ferry._distributed_initialize()
    _initialized = True
    atexit.register(shutdown)
    from . import global_devices

    global_devices("host")


def shutdown() -> None:
    """Finalizes MPI if ferry initialised it and no process of the job failed (finalizing would
    then wait for a dead one). Called at exit; safe to call more than once."""
    _ferry._distributed_finalize()


def is_initialized() -> bool:
    """Whether this process has joined a job with `initialize()` (and not shut it down since)."""
    return _initialized


def engine() -> str:
    """"mpi" in an MPI job that ferry joined, else "single"."""
    return _ferry._distributed_engine()


@contextlib.contextmanager
def agreed(step: str) -> Iterator[None]:
    """Runs the block on every process, then agrees on its outcome: if it raised on any process,
    every process raises the same ferry error naming the first failing rank and the cause."""
    from ._errors import _ERROR_CODES, Error

    code, message = None, ""
    try:
        yield
    except Exception as error:  # noqa: BLE001: any failure must reach the other processes
        if _ferry.process_count() == 1:
            raise  # nobody to tell: the error as it is
        if isinstance(error, Error):
            code, message = _ERROR_CODES.get(type(error), 2), str(error)
        else:
            code, message = 2, f"{type(error).__name__}: {error}"  # 2: UNKNOWN
    _ferry._agree(code, message, step)
