"""One process of a multi-process test job: tests/python/test_distributed.py starts it with
`mpiexec -n N python distributed_worker.py CASE DIR`. Every process checks what it holds against
numpy slicing of the same data, prints "rank R ok: ..." on success and exits non-zero otherwise."""

import os
import sys
import time

import numpy as np

if sys.argv[1:2] == ["mpi4py_first"]:
    # The program uses mpi4py before ferry: importing mpi4py.MPI initialises MPI (and registers
    # its MPI_Finalize at exit); ferry must join that MPI, not initialise or finalize it again.
    from mpi4py import MPI

os.environ.setdefault("FERRY_HOST_DEVICES", "2")
import ferry  # noqa: E402

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]


def random_array(rng, shape, dtype_name):
    dtype = ferry._dtypes._NUMPY_DTYPES[dtype_name]
    if dtype_name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def write_checkpoint(path):
    """The same tensors on every rank (seeded): every dtype, uneven shapes, a scalar, an empty one."""
    rng = np.random.default_rng(1234)
    tensors = {}
    for i, name in enumerate(DTYPES):
        if name != "complex128":  # safetensors has no complex128 (checked in case_load, put)
            tensors[f"w_{name}"] = random_array(rng, (13 + i, 5), name)
    tensors["uneven"] = random_array(rng, (7, 3, 11), "float32")
    tensors["scalar"] = np.array(3.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    tensors["vector"] = random_array(rng, (9,), "int32")
    if ferry.process_index() == 0:
        ferry.save_file(tensors, path)
    ferry._ferry._barrier("the checkpoint is written")
    return tensors


def check_shards(name, array, expected):
    shards = array.addressable_shards
    for shard in shards:
        if not shard.device.is_addressable or shard.device.process_index != ferry.process_index():
            raise AssertionError(f"{name}: shard on {shard.device} is not this process's")
        want = expected[shard.index]
        if not same_bits(shard.data, np.array(want)):  # (ascontiguousarray makes 0-d 1-d)
            raise AssertionError(f"{name}: shard {shard.index} differs from numpy slicing")
    return len(shards)


def case_load(directory):
    me, count = ferry.process_index(), ferry.process_count()
    path = os.path.join(directory, "checkpoint.safetensors")
    tensors = write_checkpoint(path)
    devices = ferry.global_devices()
    assert len(devices) == 2 * count, devices
    assert [d.id for d in devices] == list(range(2 * count))
    assert [d.process_index for d in devices] == [i // 2 for i in range(2 * count)]
    assert sum(d.is_addressable for d in devices) == 2
    assert all(d.backend == "host" for d in devices)
    assert len(ferry.devices("host")) == 2  # devices() stays local
    # Every process names its devices from 0: in the job a name carries its process.
    for d in devices:
        local_name = f"host:{d.id % 2}"
        job_name = local_name if count == 1 else f"p{d.id // 2}/{local_name}"
        assert (d.name, d.global_name, repr(d)) == (local_name, job_name, f"Device({job_name})"), \
            (d.name, d.global_name, repr(d))

    remote = [d for d in devices if not d.is_addressable]
    if remote:
        try:
            ferry.device_put(np.zeros(3), remote[0])
        except ferry.FailedPreconditionError as error:
            assert "not this process's" in str(error), error
        else:
            raise AssertionError("a put to another process's device did not raise")
        try:
            ferry.Mesh([remote[0], devices[me * 2], remote[0]], [3], ["x"])
        except ferry.InvalidArgumentError as error:
            assert f"device {remote[0].global_name} appears twice" in str(error), error
        else:
            raise AssertionError("a mesh holding a device twice did not raise")

    # 1-d mesh over every device, dim 0 split (uneven), lower ranks replicated.
    mesh = ferry.Mesh(devices, [len(devices)], ["all"])
    loaded = ferry.load_file(path, sharding=ferry.shard_along(mesh, dim=0))
    checked = 0
    for name, expected in tensors.items():
        array = loaded[name]
        replicated = expected.ndim == 0
        assert array.is_fully_addressable == (count == 1), name  # JAX: every device is ours
        checked += check_shards(name, array, expected)
        if replicated or expected.size == 0:  # (an empty tensor's shards are all alike)
            assert same_bits(ferry.device_get(array), expected), name
        elif count > 1:
            try:
                ferry.device_get(array)
            except ferry.FailedPreconditionError as error:
                assert "another process" in str(error), error
                assert "lives only on device p" in str(error), error  # p1/host:0, not host:0
            else:
                raise AssertionError(f"{name}: reading a non-addressable shard did not raise")

    # 2-d mesh (processes x local devices), both dims of a 3-d tensor split, dim 2 replicated;
    # and a strided (transposed) source put with the same sharding.
    mesh2 = ferry.Mesh(devices, [count, 2], ["proc", "local"])
    sharding = ferry.Sharding(mesh2, ["proc", "local", None])
    loaded2 = ferry.load_file(path, sharding={n: (sharding if t.ndim == 3 else ferry.Sharding(mesh2, [None] * t.ndim))
                                              for n, t in tensors.items()})
    checked += check_shards("uneven 2-d", loaded2["uneven"], tensors["uneven"])
    transposed = tensors["uneven"].transpose(2, 0, 1)
    put = ferry.device_put(transposed, ferry.Sharding(mesh2, [("proc", "local"), None, None]))
    checked += check_shards("transposed", put, transposed)
    wide = random_array(np.random.default_rng(3), (2 * count + 1, 3), "complex128")
    checked += check_shards("complex128", ferry.device_put(wide, ferry.Sharding(mesh, ["all", None])), wide)
    # Replicated over every device: fully addressable nowhere but readable everywhere.
    rep = ferry.load_file(path, sharding=ferry.Sharding(mesh2, [None, None]))["w_float64"]
    assert same_bits(ferry.device_get(rep), tensors["w_float64"])
    # Every read path takes this process's replicas, as device_get(a) does (before: out= and
    # copy_to_host_async refused any array with another process's devices in its mesh).
    within = ferry.device_put(tensors["w_float64"], ferry.Sharding(mesh2, [None, "local"]))
    for label, array in (("replicated", rep), ("split within each process", within)):
        out = np.full_like(tensors["w_float64"], np.nan)
        ferry.device_get(array, out=out)
        assert same_bits(out, tensors["w_float64"]), label
        array.copy_to_host_async()
        assert same_bits(array.to_numpy(), tensors["w_float64"]), label
        # devices: every mesh device, other processes' too (JAX's Array.devices()).
        assert [d.global_name for d in array.devices] == [d.global_name for d in devices], label
    if count > 1:
        # Before: pickled with process-local names, unpickled onto this process's devices
        # ("device p0/host:0 appears twice in the mesh").
        import pickle
        try:
            pickle.dumps(rep)
        except ferry.FailedPreconditionError as error:
            assert "other processes' devices" in str(error), error
        else:
            raise AssertionError("pickling an array over other processes' devices did not raise")

    # make_array_from_callback: called only for this process's devices.
    calls = []

    def callback(index):
        calls.append(index)
        return tensors["w_int64"][index]

    made = ferry.make_array_from_callback(tensors["w_int64"].shape, ferry.Sharding(mesh, ["all", None]), callback)
    assert len(calls) == 2, calls
    checked += check_shards("callback", made, tensors["w_int64"])

    # make_array_from_process_local_data, JAX's meaning: rows of this process's devices.
    full = random_array(np.random.default_rng(7), (8 * count, 3), "float32")
    rows = full[8 * me: 8 * (me + 1)]
    local = ferry.make_array_from_process_local_data(ferry.Sharding(mesh, ["all", None]), rows)
    assert tuple(local.shape) == full.shape, local.shape
    checked += check_shards("process-local", local, full)
    # Uneven: 10*count - 1 rows need global_shape; dim 1 split within the process.
    full = random_array(np.random.default_rng(8), (4 * count - 1, 6), "int16")
    s2 = ferry.Sharding(mesh2, ["proc", "local"])
    begin = 4 * me
    part = full[begin: min(begin + 4, full.shape[0])]
    local2 = ferry.make_array_from_process_local_data(s2, part, global_shape=full.shape)
    checked += check_shards("process-local uneven", local2, full)
    if count > 1:
        # Parts of uneven size without global_shape: each process inferred its own global shape
        # (before: silently different arrays, shards labelled with the wrong rows); now compared.
        part = full[: 4 if me == 0 else 2]
        try:
            ferry.make_array_from_process_local_data(ferry.Sharding(mesh, ["all", None]), part)
        except ferry.InvalidArgumentError as error:
            assert "global shape inferred" in str(error) and "differs between ranks" in str(error), error
        else:
            raise AssertionError("uneven parts without global_shape did not raise")
        # A part that does not split into this process's shards, on rank 0 only: every rank
        # raises that error at once (before: rank 0 raised, the others waited in the collective
        # until its timeout).
        part = full[: 3 if me == 0 else 4]
        started = time.monotonic()
        try:
            ferry.make_array_from_process_local_data(ferry.Sharding(mesh, ["all", None]), part)
        except ferry.InvalidArgumentError as error:
            assert "does not split evenly" in str(error), error
            assert time.monotonic() - started < 10, time.monotonic() - started
        else:
            raise AssertionError("a part that does not split evenly did not raise")
    print(f"rank {me} ok: {checked} shards match numpy slicing", flush=True)


def case_spmd(directory):
    """test_sharding.py's SPMD resolve-and-commit scenario (torch_xla's SPMDLoadPlanner test) with
    the mesh spanning the processes: each process negates its local shards on the host and commits
    them as a new array asynchronously, reading the previous array's shards meanwhile."""
    from ferry import _testing as testing

    testing.set_release_gil(os.environ.get("RELEASE_GIL", "1") == "1")
    testing.set_deferred_release(os.environ.get("DEFERRED_RELEASE", "1") == "1")
    devices = ferry.global_devices()
    mesh = ferry.Mesh(devices, [len(devices)], ["x"])
    sharding = ferry.Sharding(mesh, ("x", None))
    x = np.arange(16 * len(devices) * 64, dtype=np.float32).reshape(16 * len(devices), 64)
    array = ferry.device_put(x, sharding)
    positions = {d: i for i, d in enumerate(mesh.devices)}
    repeats = 40
    for _ in range(repeats):
        before = array.addressable_shards
        shards = [None] * len(devices)
        for shard in before:
            shards[positions[shard.device]] = -shard.data
        new = ferry.make_array_from_shards(array.shape, sharding, shards, semantics="async")
        unchanged = array.addressable_shards
        for b, u in zip(before, unchanged):
            assert np.array_equal(b.data, u.data), "shards changed before the commit"
        after = new.addressable_shards
        for b, a in zip(before, after):
            assert np.array_equal(-b.data, a.data), "shards unchanged after the commit"
        array = new
    for shard in array.addressable_shards:
        assert np.array_equal(shard.data, x[shard.index]), "wrong data after the commits"
    ferry._ferry._barrier("all committed")
    print(f"rank {ferry.process_index()} ok: {repeats} commits", flush=True)


def check_alongside_mpi4py(directory, comm):
    """ferry's collectives and mpi4py's on the same processes, interleaved, both ways round."""
    me, count = ferry.process_index(), ferry.process_count()
    assert (me, count) == (comm.Get_rank(), comm.Get_size()), (me, count, comm.Get_rank())
    assert ferry.distributed.engine() == "mpi"
    # mpi4py, then ferry: every rank's pid gathered both ways gives the same list.
    pids = comm.allgather(os.getpid())
    assert len(set(pids)) == count, pids
    path = os.path.join(directory, "checkpoint.safetensors")
    tensors = write_checkpoint(path)  # ferry's barrier inside
    devices = ferry.global_devices()
    mesh = ferry.Mesh(devices, [len(devices)], ["all"])
    loaded = ferry.load_file(path, sharding=ferry.shard_along(mesh, dim=0))
    checked = sum(check_shards(name, loaded[name], expected) for name, expected in tensors.items())
    # ferry, then mpi4py: the ranks' shard counts add up to every device's shards of every tensor.
    total = comm.allreduce(checked)
    assert total == len(devices) * len(tensors), (total, len(devices), len(tensors))
    comm.Barrier()
    ferry._ferry._barrier("after mpi4py's collectives")
    return checked, total


def case_mpi4py_first(directory):
    assert MPI.Is_initialized() and not MPI.Is_finalized()
    checked, total = check_alongside_mpi4py(directory, MPI.COMM_WORLD)
    ferry.distributed.shutdown()  # (also at exit) leaves an MPI that mpi4py initialised alone
    assert not MPI.Is_finalized()
    MPI.COMM_WORLD.Barrier()
    print(f"rank {ferry.process_index()} ok: mpi4py first, {checked} of {total} shards, "
          f"thread level {MPI.Query_thread()}", flush=True)


def case_mpi4py_after(directory):
    # ferry initialised MPI (in __main__); mpi4py imported now joins it and leaves finalizing to
    # ferry at exit.
    from mpi4py import MPI

    assert MPI.Is_initialized()
    checked, total = check_alongside_mpi4py(directory, MPI.COMM_WORLD)
    print(f"rank {ferry.process_index()} ok: mpi4py after ferry, {checked} of {total} shards",
          flush=True)


def case_cannot_open(directory):
    # Rank 1 looks in a folder without the file.
    me = ferry.process_index()
    path = os.path.join(directory, "checkpoint.safetensors")
    write_checkpoint(path)
    mesh = ferry.Mesh(ferry.global_devices(), [2 * ferry.process_count()], ["all"])
    if me == 1:
        path = os.path.join(directory, "missing", "checkpoint.safetensors")
    try:
        ferry.load_file(path, sharding=ferry.shard_along(mesh))
    except ferry.NotFoundError as error:
        print(f"rank {me} error: {error}", flush=True)
        sys.exit(3)
    print(f"rank {me}: no error", flush=True)


def case_mesh_differs(directory):
    me = ferry.process_index()
    path = os.path.join(directory, "checkpoint.safetensors")
    write_checkpoint(path)
    devices = ferry.global_devices()
    mesh = ferry.Mesh(devices if me == 0 else devices[::-1], [len(devices)], ["all"])
    try:
        ferry.load_file(path, sharding=ferry.shard_along(mesh))
    except ferry.InvalidArgumentError as error:
        print(f"rank {me} error: {error}", flush=True)
        sys.exit(3)
    print(f"rank {me}: no error", flush=True)


def expect_disagreement(directory, label, call):
    """`call` must raise InvalidArgumentError (the ranks disagree); its message is kept in
    DIR/LABEL_RANK.txt for the test to compare across ranks and measure."""
    try:
        call()
    except ferry.InvalidArgumentError as error:
        with open(os.path.join(directory, f"{label}_{ferry.process_index()}.txt"), "w") as f:
            f.write(str(error))
        return
    raise AssertionError(f"{label}: the ranks disagreed and load_file did not raise")


LONG_NAME = ("model.language_model.encoder.layers.17.self_attention.query_key_value."
             "lora_adapter.weight")


def case_plans_differ(directory):
    """load_file(..., sharding=...) where rank 1 differs from rank 0 in one thing at a time: the
    device order of the mesh, one tensor's spec (a tensor with a name too long for one line), the
    device dtype. Each is an error on every rank; the messages go to files (see
    expect_disagreement)."""
    me = ferry.process_index()
    path = os.path.join(directory, "plans.safetensors")
    rng = np.random.default_rng(28)
    tensors = {"embed": random_array(rng, (8, 6), "float32"),
               LONG_NAME: random_array(rng, (8, 6), "float32"),
               "bias": random_array(rng, (8,), "float32")}
    if me == 0:
        ferry.save_file(tensors, path)
    ferry._ferry._barrier("the checkpoint is written")
    devices = ferry.global_devices()
    mesh = ferry.Mesh(devices, [len(devices)], ["all"])
    reversed_mesh = ferry.Mesh(devices[::-1], [len(devices)], ["all"])
    expect_disagreement(directory, "mesh", lambda: ferry.load_file(
        path, sharding=ferry.shard_along(mesh if me == 0 else reversed_mesh)))
    # One tensor split along dim 1 on rank 1, dim 0 on rank 0; every other tensor the same.
    specs = {"embed": ["all", None], LONG_NAME: ["all", None] if me == 0 else [None, "all"],
             "bias": ["all"]}
    expect_disagreement(directory, "spec", lambda: ferry.load_file(
        path, sharding={name: ferry.Sharding(mesh, spec) for name, spec in specs.items()}))
    expect_disagreement(directory, "dtype", lambda: ferry.load_file(
        path, sharding=ferry.shard_along(mesh), device_dtype="float16" if me == 1 else None))
    print(f"rank {me} ok: 3 disagreements raised", flush=True)


def case_killed(directory):
    me = ferry.process_index()
    ferry._ferry._barrier("everyone started")
    if me == 1:
        time.sleep(1)  # dies while the others wait, as a rank that crashes in its own work
        if os.environ.get("DEATH") == "exit":
            os._exit(1)  # ends at once: no MPI_Finalize, no cleanup
        os.kill(os.getpid(), 9)
    try:
        ferry.global_devices("host")  # gathered already: no collective
        ferry._ferry._barrier("after the kill")
    except ferry.Error as error:
        print(f"rank {me} error: {error}", flush=True)
        sys.exit(3)
    print(f"rank {me}: no error", flush=True)


def process_ended(pid):
    """True when `pid` no longer runs: gone, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between open and read
        return True


def case_dead_before_collective(directory):
    """Rank 1 exits (no MPI_Finalize) right after a barrier; the others wait until its process has
    ended, then start a collective: ferry must fail it at once on every survivor, without calling
    MPI (which would wait for the dead rank)."""
    me = ferry.process_index()
    with open(os.path.join(directory, f"pid_{me}"), "w") as f:
        f.write(str(os.getpid()))
    ferry._ferry._barrier("everyone started")
    # Rank 1 dies only once every other rank has left that barrier: a barrier returns on the ranks
    # one by one, and a survivor still inside it would find the death there, outside the case.
    if me != 1:
        with open(os.path.join(directory, f"left_{me}"), "w") as f:
            f.write("left the barrier")
    else:
        others = [rank for rank in range(ferry.process_count()) if rank != 1]
        deadline = time.monotonic() + 30
        while not all(os.path.exists(os.path.join(directory, f"left_{rank}")) for rank in others):
            if time.monotonic() > deadline:
                print("rank 1: the others did not leave the barrier in 30 s", flush=True)
                os._exit(4)
            time.sleep(0.01)
        os._exit(1)
    with open(os.path.join(directory, "pid_1")) as f:
        dead = int(f.read())
    deadline = time.monotonic() + 30
    while not process_ended(dead):
        if time.monotonic() > deadline:
            print(f"rank {me}: rank 1 (pid {dead}) still runs after 30 s", flush=True)
            sys.exit(4)
        time.sleep(0.01)
    try:
        ferry._ferry._barrier("after the death")
    except ferry.Error as error:
        print(f"rank {me} error: {error}", flush=True)
        sys.exit(3)
    print(f"rank {me}: no error", flush=True)


def case_uncaught_exception(directory):
    """Rank 1 ends on an uncaught exception while the others enter a collective: it leaves without
    waiting in MPI_Finalize, so they find it gone at once (not after FERRY_DISTRIBUTED_TIMEOUT_S)."""
    if ferry.process_index() == 1:
        raise RuntimeError("a bug on rank 1")
    try:
        with ferry.distributed.agreed("next step"):
            pass
    except ferry.Error as error:
        print(f"rank {ferry.process_index()} error: {error}", flush=True)
        sys.exit(3)
    print(f"rank {ferry.process_index()}: no error", flush=True)


def case_interrupted_inside_agreed(directory):
    """KeyboardInterrupt inside an agreed block on rank 1: the others raise the agreed error, and
    rank 1 its own KeyboardInterrupt (before: the others waited for it until the timeout)."""
    me = ferry.process_index()
    try:
        with ferry.distributed.agreed("a step"):
            if me == 1:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        print(f"rank {me}: KeyboardInterrupt", flush=True)
    except ferry.Error as error:
        print(f"rank {me} error: {error}", flush=True)


def case_out_of_order(directory):
    """Ranks at different steps are told so on every rank, instead of agreeing on the wrong one."""
    me = ferry.process_index()
    try:
        with ferry.distributed.agreed(f"step {me % 2}"):
            pass
        print(f"rank {me}: no error", flush=True)
    except ferry.Error as error:
        print(f"rank {me} error: {error}", flush=True)


def case_after_shutdown(directory):
    """Collectives after shutdown() raise; is_initialized() is False; initialize() refuses."""
    me = ferry.process_index()
    ferry.distributed.shutdown()
    outcomes = [ferry.distributed.is_initialized()]
    for call in (lambda: ferry._ferry._agree(None, "", "after"), ferry.distributed.initialize):
        try:
            call()
            outcomes.append("no error")
        except ferry.FailedPreconditionError as error:
            outcomes.append("shutdown" in str(error))
    print(f"rank {me}: {outcomes}", flush=True)


def case_global_devices_before_initialize(directory):
    """global_devices() asked before initialize() (one process then) is gathered job-wide after it:
    a sharded load over the mesh splits the tensor between the ranks (each held it whole)."""
    import numpy as np

    early = ferry.global_devices()
    ferry.distributed.initialize()
    devices = ferry.global_devices()
    path = os.path.join(directory, "w.npy")
    if ferry.process_index() == 0:
        np.save(path, np.arange(32, dtype=np.float32).reshape(8, 4))
    ferry._ferry._barrier("written")
    mesh = ferry.Mesh(devices, (len(devices),), ("x",))
    array = ferry.load_file(path, sharding=ferry.shard_along(mesh, dim=0))["w"]
    print(f"rank {ferry.process_index()}: {len(early)} early, {len(devices)} job-wide, "
          f"fully addressable {array.is_fully_addressable}", flush=True)


# Cases that call initialize() themselves, later than at start.
_INITIALIZE_LATER = {"global_devices_before_initialize"}

if __name__ == "__main__":
    if sys.argv[1] not in _INITIALIZE_LATER:
        ferry.distributed.initialize()
    globals()["case_" + sys.argv[1]](sys.argv[2])
