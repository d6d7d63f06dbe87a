"""bench/peers.py, the peers of ferry-bench --peers: its --serve protocol (which ferry-bench drives
turn by turn with its own runs) and, when FERRY_BENCH names a built ferry-bench (scripts/test.sh
sets it), the whole --peers run end to end at a tiny size."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEERS = ROOT / "bench" / "peers.py"
SIZE = "0.002"  # 4096^2 f32 cases become 183^2: milliseconds per run


class Server:
    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, str(PEERS), "--serve", "--size", SIZE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)

    def call(self, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


@pytest.fixture
def server():
    started = Server()
    yield started
    started.close()


def peer_available(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


@pytest.mark.parametrize("case", ["h2d_strided_slice", "h2d_convert_f32_bf16",
                                  "d2h_upcast_bf16_f32"])
def test_serve_times_each_peer_once_per_run(server, case):
    assert server.call(op="prepare", case=case) == {"ok": True}
    for _ in range(3):
        assert server.call(op="run") == {"ok": True}
    row = server.call(op="finish")
    assert row["case"] == case
    for peer in ("torch", "jax", "numpy"):
        if peer != "numpy" and not peer_available(peer):
            assert row[f"{peer}_seconds_median"] is None and f"{peer}_error" in row
            continue
        assert f"{peer}_error" not in row, row.get(f"{peer}_error")
        times = row[f"{peer}_seconds_all"]
        assert len(times) == 3 and all(t > 0 for t in times)
        assert row[f"{peer}_seconds_median"] == sorted(times)[1]
        assert row[f"{peer}_method"]


def test_serve_reports_bad_commands_and_keeps_serving(server):
    unknown_op = server.call(op="bogus")
    assert unknown_op["ok"] is False and "bogus" in unknown_op["error"]
    unknown_case = server.call(op="prepare", case="no_such_case")
    assert unknown_case["ok"] is False and "no_such_case" in unknown_case["error"]
    assert server.call(op="prepare", case="h2d_contiguous") == {"ok": True}
    assert server.call(op="run") == {"ok": True}
    assert server.call(op="finish")["numpy_seconds_median"] > 0


def test_one_shot_mode_prints_the_same_rows():
    output = subprocess.run(
        [sys.executable, str(PEERS), "--size", SIZE, "--repeats", "2", "--case",
         "h2d_transposed"], check=True, capture_output=True, text=True).stdout
    (row,) = json.loads(output)["results"]
    assert row["case"] == "h2d_transposed"
    assert row["source_byte_strides"] == [4, 4 * row["dims"][0]]  # the .T of a square
    assert len(row["numpy_seconds_all"]) == 2


@pytest.mark.skipif("FERRY_BENCH" not in os.environ,
                    reason="FERRY_BENCH does not name a built ferry-bench (scripts/test.sh sets it)")
def test_ferry_bench_peers_end_to_end(tmp_path):
    result_file = tmp_path / "bench.json"
    run = subprocess.run(
        [os.environ["FERRY_BENCH"], "--peers", "--python", sys.executable, "--size", SIZE,
         "--repeats", "5", "--case",
         "h2d_transposed,d2h_upcast_bf16_f32,h2d_many_small,h2d_convert_f64_f32",
         "--json", str(result_file)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {row["case"]: row for row in json.loads(result_file.read_text())["results"]}
    for case in ("h2d_transposed", "d2h_upcast_bf16_f32"):
        row = rows[case]
        assert row["vs_numpy"] > 0
        assert len(row["numpy_seconds_all"]) == 5  # one numpy run per ferry run
        assert row["vs_numpy"] == pytest.approx(row["numpy_seconds_median"] / row["seconds_median"])
    assert "vs_torch" not in rows["h2d_many_small"]  # no peers for that case
    # The floor pass of the converting case that halves its bytes: vs_staged's ceiling (an AVX2
    # pass: a CPU without AVX2 has no floor fields).
    converted = rows["h2d_convert_f64_f32"]
    if " avx2" not in pathlib.Path("/proc/cpuinfo").read_text():
        assert "floor_seconds" not in converted
        return
    assert converted["floor_seconds"] > 0
    assert converted["vs_staged_bound"] == pytest.approx(
        converted["staged_seconds_median"] / converted["floor_seconds"])
    assert "floor_seconds" not in rows["h2d_transposed"]


@pytest.mark.skipif("FERRY_BENCH" not in os.environ,
                    reason="FERRY_BENCH does not name a built ferry-bench (scripts/test.sh sets it)")
def test_ferry_bench_reports_peers_that_cannot_start(tmp_path):
    result_file = tmp_path / "bench.json"
    run = subprocess.run(
        [os.environ["FERRY_BENCH"], "--peers", "--python", str(tmp_path / "no-such-python"),
         "--size", SIZE, "--repeats", "5", "--case", "h2d_strided_slice", "--json",
         str(result_file)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1  # the case ran; its peers failed
    assert "peers FAILED" in run.stdout
    (row,) = json.loads(result_file.read_text())["results"]
    assert row["seconds_median"] > 0
    for peer in ("torch", "jax", "numpy"):
        assert row[f"vs_{peer}"] is None
        assert "no-such-python" in row[f"{peer}_error"]


def xla_cpu_plugin():
    import sysconfig

    path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "xla_plugins" / "xla_cpu_pjrt" / \
        "xla_cpu_pjrt.so"
    return path if path.is_file() else None


@pytest.mark.skipif(not peer_available("jax"), reason="jax is not installed")
@pytest.mark.skipif(xla_cpu_plugin() is None, reason="xla-cpu-pjrt is not installed")
def test_jax_puts_onto_the_pjrt_plugin_when_given_one():
    # What ferry-bench --peers does on a pjrt device: jax puts onto the same plugin, and checks
    # every result against the source as on its own CPU device.
    plugin = str(xla_cpu_plugin())
    output = subprocess.run(
        [sys.executable, str(PEERS), "--size", SIZE, "--repeats", "2", "--case",
         "h2d_transposed", "d2h_upcast_bf16_f32", "--jax-plugin", plugin],
        check=True, capture_output=True, text=True, timeout=300)
    rows = json.loads(output.stdout)["results"]
    assert [row["case"] for row in rows] == ["h2d_transposed", "d2h_upcast_bf16_f32"]
    for row in rows:
        assert "jax_error" not in row, row.get("jax_error")
        assert row["jax_device"] == plugin
        assert row["jax_seconds_median"] > 0


def test_fresh_loads_times_each_loader_in_fresh_processes(tmp_path):
    """bench/fresh_loads.py (ferry-bench --fresh-loads): every loader a new process per run, with
    its load time, process time and peak RSS; ferry's row compared with safetensors'."""
    ferry_command = pathlib.Path(sys.executable).parent / "ferry"
    if not ferry_command.exists():
        pytest.skip(f"no ferry command beside {sys.executable} (pip install . puts it there)")
    result_file = tmp_path / "loads.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fresh_loads.py"), "--files", "many_20k",
         "--loaders", "ferry,ferry_put,safetensors", "--cache", "warm", "--repeats", "1",
         "--data-dir", str(tmp_path), "--ferry", str(ferry_command), "--json", str(result_file)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(result_file.read_text())
    rows = {row["loader"]: row for row in document["results"]}
    assert set(rows) == {"ferry", "ferry_put", "safetensors"}
    for row in rows.values():
        assert row["error"] is None, row
        assert row["seconds_median"] > 0 and row["peak_rss_bytes_median"] > 0
        assert row["process_seconds_median"] >= row["seconds_median"]
    assert rows["ferry"]["vs_safetensors"] == pytest.approx(
        rows["safetensors"]["seconds_median"] / rows["ferry"]["seconds_median"])
    # Two runs per loader: the untimed warm-up and the timed one, each a process of its own.
    assert len(document["runs"]) == 3


@pytest.mark.parametrize("prefault", [False, True], ids=["read_floor", "prefault_floor"])
def test_fresh_loads_floors_read_every_byte_of_the_file(tmp_path, prefault):
    """The loaders' yardsticks read the file's exact bytes into fresh memory; prefault_floor's
    madvise(MADV_POPULATE_WRITE) of each read's pages raises on any error but a kernel without the
    call (EINVAL). An odd size ends inside a read and inside a page."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import fresh_loads
    finally:
        sys.path.remove(str(ROOT / "bench"))
    data = os.urandom(3 * (1 << 20) + 4097)
    path = tmp_path / "bytes.bin"
    path.write_bytes(data)
    read = fresh_loads.read_into_fresh_memory(str(path), direct=False, threads=3,
                                              read_bytes=1 << 20, prefault=prefault)
    assert read["bytes"].dtype == torch.uint8
    assert bytes(read["bytes"].numpy()) == data
