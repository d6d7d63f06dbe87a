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
import sys
from typing import Any, Iterator

from . import _ferry

__all__ = ["initialize", "shutdown", "is_initialized", "engine"]

_initialized = False
_shut_down = False
_uncaught_exception = False


def initialize() -> None:
    """Joins the job this program was started in: under mpiexec, the MPI job (MPI is initialised
    here unless the program already did, e.g. by importing mpi4py; ferry never finalizes an MPI it
    did not initialise); otherwise a no-op, one process. Idempotent. Also gathers the host
    backend's global device list (a collective call). After `shutdown()` of an MPI job:
    FailedPreconditionError (MPI cannot be initialised twice)."""
    global _initialized
    if _initialized:
        return
    if _shut_down and _ferry._distributed_engine() == "mpi":
        from ._errors import FailedPreconditionError

        raise FailedPreconditionError(
            "ferry.distributed.initialize() after shutdown(): MPI cannot be joined again in this "
            "process")
    _ferry._distributed_initialize()
    _initialized = True
    atexit.register(shutdown)
    _note_uncaught_exceptions()
    from . import global_devices

    global_devices("host")


def _note_uncaught_exceptions() -> None:
    """A process that ends on an uncaught exception (a bug, Ctrl-C) leaves the job without
    finalizing MPI: the others, waiting for it in a collective, see it gone within a moment
    instead of waiting FERRY_DISTRIBUTED_TIMEOUT_S while it waits in MPI_Finalize for them."""
    previous = sys.excepthook

    def note_then_report(kind: Any, value: Any, traceback: Any) -> None:
        global _uncaught_exception
        _uncaught_exception = True
        previous(kind, value, traceback)

    sys.excepthook = note_then_report


def shutdown() -> None:
    """Leaves the job: finalizes MPI if ferry initialised it, no process of the job is known to
    have failed or ended, and this one is not ending on an uncaught exception (finalizing would
    then wait for the others, which wait for it), waiting for the others' finalize only while
    every one of them is there. Called at exit; safe to call more than once. Collective calls
    afterwards raise FailedPreconditionError."""
    global _initialized, _shut_down
    if _initialized:
        _shut_down = True
    _initialized = False
    if _uncaught_exception:
        return
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
    except GeneratorExit:
        raise  # the generator holding the block was closed: nothing ran to agree on
    except BaseException as error:  # noqa: BLE001: any failure must reach the other processes
        if _ferry.process_count() == 1:
            raise  # nobody to tell: the error as it is
        if isinstance(error, Error):
            code, message = _ERROR_CODES.get(type(error), 2), str(error)
        else:
            code, message = 2, f"{type(error).__name__}: {error}"  # 2: UNKNOWN
        if not isinstance(error, Exception):
            # Ctrl-C or sys.exit() inside the block: the others are told (they raise the agreed
            # error), and this process goes on with its own.
            with contextlib.suppress(Error):
                _ferry._agree(code, message, step)
            raise
    _ferry._agree(code, message, step)
